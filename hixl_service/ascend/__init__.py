"""The Ascend (ACL/HCCL) backend of the daemon; the shim itself is ``hixl_native._ascend``.

* `backend`: CANN at start-up, device pools, ACL copies, device budgets.
* `comms`: what link communicators are built with (HCCL's network
  environment, rank tables, buffer sizes).
* `onesided`: device memory registered for one-sided HCCL, and the
  communicators it is bound to.
* `smoke`: ``python -m hixl_service.ascend.smoke``, the hardware smoke test.

The HCCL transport is ``transports.hccl``; ACL and HCCL error codes become
`LLMStatusCode` in ``native_errors``.
"""
