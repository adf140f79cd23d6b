"""Python 3.10 support: ``asyncio.timeout`` arrived in 3.11.

Catch ``asyncio.TimeoutError`` (the builtin ``TimeoutError`` from 3.11 on),
which both implementations raise.
"""

from __future__ import annotations

import sys

if sys.version_info >= (3, 11):
    from asyncio import timeout
else:  # pragma: no cover - exercised on 3.10 only
    from async_timeout import timeout

__all__ = ["timeout"]
