"""Address translation for IPC-imported device memory.

On Ascend a client maps the daemon's device pools with
``aclrtIpcMemImportByKey``; its cache addresses are then addresses in its
own process, different from the daemon's. A request names addresses of the
client, so the daemon keeps, per importing process, where each export key
landed (`IpcAddressMap`) and translates every range to (key, offset) before
using it, and back when it hands out addresses. Each translation checks the
whole range against one import: a range that is unknown, or that runs past
the end of its import, is refused.

Refusals of caller-supplied values raise `LLMException` with
``LLM_PARAM_INVALID``; inconsistent registrations (a key twice, overlapping
imports) are the daemon's own mistakes and raise `ValueError`.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Iterator

from hixl_client.status import LLMException, LLMStatusCode

__all__ = ["IpcAddressMap", "IpcImport"]

_ADDRESS_LIMIT = 1 << 64


@dataclasses.dataclass(frozen=True)
class IpcImport:
    """Where one export landed in an importing process.

    Attributes:
        key: The export key (``aclrtIpcMemGetExportKey``).
        base: Address of the export's byte 0 in the importing process.
        size: Bytes of the export.
    """

    key: str
    base: int
    size: int

    @property
    def end(self) -> int:
        """One past the last address."""
        return self.base + self.size


def _refuse(message: str) -> LLMException:
    return LLMException(message, status_code=LLMStatusCode.LLM_PARAM_INVALID)


def _check_int(value: object, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{what} must be an int, not {type(value).__name__}")
    return value


class IpcAddressMap:
    """The IPC imports of one importing process, by key and by address."""

    def __init__(self) -> None:
        self._by_key: dict[str, IpcImport] = {}
        self._bases: list[int] = []  # sorted
        self._sorted: list[IpcImport] = []  # in the order of _bases

    def __len__(self) -> int:
        return len(self._by_key)

    def __contains__(self, key: object) -> bool:
        return key in self._by_key

    def __iter__(self) -> Iterator[IpcImport]:
        return iter(list(self._sorted))

    def add(self, key: str, base: int, size: int) -> IpcImport:
        """Record that ``key`` is mapped at ``[base, base + size)``.

        Args:
            key: The export key.
            base: The importing process's address of the export's byte 0.
            size: The export's size, > 0.

        Returns:
            The recorded import.

        Raises:
            ValueError: The key is known, the range is empty or beyond 64 bits,
                or it overlaps another import.
        """
        base, size = _check_int(base, "base"), _check_int(size, "size")
        if key in self._by_key:
            raise ValueError(f"IPC key {key!r} is already mapped")
        if size <= 0 or base <= 0 or base + size > _ADDRESS_LIMIT:
            raise ValueError(f"bad IPC mapping [{base:#x}, +{size:#x})")
        at = bisect.bisect_left(self._bases, base)
        if at > 0 and self._sorted[at - 1].end > base:
            raise ValueError(f"IPC mapping of {key!r} overlaps {self._sorted[at - 1].key!r}")
        if at < len(self._sorted) and base + size > self._sorted[at].base:
            raise ValueError(f"IPC mapping of {key!r} overlaps {self._sorted[at].key!r}")
        entry = IpcImport(key, base, size)
        self._by_key[key] = entry
        self._bases.insert(at, base)
        self._sorted.insert(at, entry)
        return entry

    def remove(self, key: str) -> IpcImport:
        """Forget an import.

        Raises:
            KeyError: The key is not mapped.
        """
        entry = self._by_key.pop(key)
        at = bisect.bisect_left(self._bases, entry.base)
        del self._bases[at]
        del self._sorted[at]
        return entry

    def get(self, key: str) -> IpcImport | None:
        """Return the import of ``key``, or None."""
        return self._by_key.get(key)

    def address_of(self, key: str, offset: int, length: int = 1) -> int:
        """Translate (key, offset) into the importing process's address.

        Args:
            key: The export key.
            offset: Offset in the export.
            length: Bytes that must lie inside the export from ``offset``.

        Returns:
            The address of ``offset``.

        Raises:
            LLMException: ``LLM_PARAM_INVALID`` for an unknown key or a range
                outside the export.
        """
        offset, length = _check_int(offset, "offset"), _check_int(length, "length")
        entry = self._by_key.get(key)
        if entry is None:
            raise _refuse(f"IPC key {key!r} is not mapped in this process")
        if offset < 0 or length < 0 or offset + length > entry.size:
            raise _refuse(
                f"range [{offset:#x}, +{length:#x}) lies outside IPC key {key!r} "
                f"of {entry.size:#x} bytes"
            )
        return entry.base + offset

    def locate(self, address: int, length: int = 1) -> tuple[str, int]:
        """Translate an address of the importing process into (key, offset).

        Args:
            address: An address in the importing process.
            length: Bytes that must lie inside one import from ``address``.

        Returns:
            The export key and the offset of ``address`` in it.

        Raises:
            LLMException: ``LLM_PARAM_INVALID`` when no single import holds
                the whole range.
        """
        address, length = _check_int(address, "address"), _check_int(length, "length")
        if address < 0 or length < 0 or address + length > _ADDRESS_LIMIT:
            raise _refuse(f"bad range [{address:#x}, +{length:#x})")
        at = bisect.bisect_right(self._bases, address) - 1
        if at >= 0:
            entry = self._sorted[at]
            inside = address < entry.end or (length == 0 and address == entry.end)
            if inside and address + length <= entry.end:
                return entry.key, address - entry.base
        raise _refuse(
            f"range [{address:#x}, +{length:#x}) is not inside one IPC-imported region"
        )
