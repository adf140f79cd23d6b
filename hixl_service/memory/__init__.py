"""Memory the daemon owns: one ``Memory`` subtype per kind (host, device, a client
process's), the ``MemoryBackend`` seam, and the backends that make each kind."""
