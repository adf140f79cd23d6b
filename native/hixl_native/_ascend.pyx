"""The ACL/HCCL shim (placeholder until the Ascend backend lands)."""
