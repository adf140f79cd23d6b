"""Pure helpers for the Ascend (ACL/HCCL) backend of the daemon.

Nothing here imports the daemon; the shim itself is ``hixl_native._ascend``.

* `errors`: the mapping of ACL and HCCL error codes to `LLMStatusCode`.
* `ipc`: address translation for IPC-imported device memory.
"""
