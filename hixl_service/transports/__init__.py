"""Transports: the one seam a link moves its bytes through (see ``base``)."""
