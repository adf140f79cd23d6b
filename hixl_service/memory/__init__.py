"""Memory the daemon owns: the MemoryBackend seam and its host and Ascend backends."""
