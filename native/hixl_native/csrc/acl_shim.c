/* The ACL/HCCL shim's C side (placeholder until the Ascend backend lands). */
