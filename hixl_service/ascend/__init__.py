"""The Ascend (ACL/HCCL) backend of the daemon; the shim itself is ``hixl_native._ascend``.

* `backend`: CANN at start-up, device pools, ACL copies.

The HCCL transport is ``transports.hccl``; ACL and HCCL error codes become
`LLMStatusCode` in ``native_errors``.
"""
