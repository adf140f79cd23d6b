"""The Ascend (ACL/HCCL) backend of the daemon; the shim itself is ``hixl_native._ascend``.

* `errors`: the mapping of ACL and HCCL error codes to `LLMStatusCode`.
* `backend`: CANN at start-up, device pools, ACL copies.
* `hccl_link`: the HCCL transport of links between daemons.
"""
