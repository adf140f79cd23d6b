"""glibc malloc settings the daemon makes for itself at start-up.

A paged pull of 100k blocks makes the daemon hold arrays of several MiB for
a few milliseconds (block lists, planned ranges, the native request). By
default glibc serves a request that large with its own mmap and returns it
on free, but then raises its mmap threshold to that size, so the next ones
come from the heap and their pages stay resident after they are freed:
over hixl-bench's 100k-block pulls the daemon peaked 11 MiB higher with the
default (about 100 against 89 MiB beside its pools). A fixed threshold keeps
every large allocation returnable; the cost, a page fault per page of each
new large array, falls only on requests of some 10k ranges and more.
"""

from __future__ import annotations

import ctypes
import ctypes.util

M_MMAP_THRESHOLD = -3  # mallopt's parameter number, from glibc's malloc.h
# Allocations of this size and more get their own mapping, always.
LARGE_ALLOCATION_BYTES = 256 * 1024


def return_large_allocations() -> bool:
    """Make glibc map every allocation of ``LARGE_ALLOCATION_BYTES`` or more on
    its own, so that freeing it returns its memory at once.

    Returns whether the setting took: False where the C library is not glibc
    (musl has no ``mallopt``), which only leaves its default behaviour.
    """
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, LARGE_ALLOCATION_BYTES))
