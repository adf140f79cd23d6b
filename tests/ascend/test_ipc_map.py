"""hixl_service.ascend.ipc: (export key, offset) <-> importing-process
addresses, with bounds checks."""

from __future__ import annotations

import pytest

from hixl_client.status import LLMException, LLMStatusCode
from hixl_service.ascend.ipc import IpcAddressMap, IpcImport

MIB = 1 << 20


@pytest.fixture
def imports() -> IpcAddressMap:
    m = IpcAddressMap()
    m.add("b", 0x7F00_0040_0000, 4 * MIB)
    m.add("a", 0x7F00_0000_0000, 2 * MIB)
    return m


def refused(excinfo: pytest.ExceptionInfo[LLMException]) -> bool:
    return excinfo.value.status_code is LLMStatusCode.LLM_PARAM_INVALID


def test_round_trip(imports: IpcAddressMap) -> None:
    for key in ("a", "b"):
        entry = imports.get(key)
        assert entry is not None
        for offset in (0, 1, entry.size - 1):
            addr = imports.address_of(key, offset)
            assert imports.locate(addr) == (key, offset)
    assert imports.address_of("a", 2 * MIB, 0) == 0x7F00_0000_0000 + 2 * MIB
    assert imports.locate(0x7F00_0000_0000 + 2 * MIB, 0) == ("a", 2 * MIB)
    assert [e.key for e in imports] == ["a", "b"]
    assert len(imports) == 2 and "a" in imports and "c" not in imports


def test_ranges_must_fit_one_import(imports: IpcAddressMap) -> None:
    base_a = 0x7F00_0000_0000
    with pytest.raises(LLMException) as caught:
        imports.address_of("a", 2 * MIB - 10, 11)
    assert refused(caught)
    with pytest.raises(LLMException) as caught:
        imports.address_of("a", -1, 1)
    assert refused(caught)
    with pytest.raises(LLMException) as caught:
        imports.address_of("zzz", 0)
    assert refused(caught)
    assert imports.locate(base_a + 2 * MIB - 10, 10) == ("a", 2 * MIB - 10)
    for addr, length in [(base_a + 2 * MIB - 10, 11), (base_a - 1, 1), (base_a + 2 * MIB, 1),
                         (0x7F00_0040_0000 + 4 * MIB, 1), (-5, 1), (1 << 64, 0)]:
        with pytest.raises(LLMException) as caught:
            imports.locate(addr, length)
        assert refused(caught), (addr, length)


def test_registration_errors(imports: IpcAddressMap) -> None:
    with pytest.raises(ValueError, match="already"):
        imports.add("a", 0x1000_0000, 1)
    with pytest.raises(ValueError, match="overlaps"):
        imports.add("c", 0x7F00_0000_0000 + 2 * MIB - 1, 2)
    with pytest.raises(ValueError, match="overlaps"):
        imports.add("c", 0x7F00_0000_0000 - 1, 2)
    with pytest.raises(ValueError):
        imports.add("c", 0x1000, 0)
    with pytest.raises(ValueError):
        imports.add("c", (1 << 64) - 1, 2)
    with pytest.raises(TypeError):
        imports.add("c", 1.5, 2)  # type: ignore[arg-type]
    # adjacent is fine
    assert imports.add("c", 0x7F00_0000_0000 + 2 * MIB, 1) == IpcImport(
        "c", 0x7F00_0000_0000 + 2 * MIB, 1
    )


def test_remove(imports: IpcAddressMap) -> None:
    entry = imports.remove("a")
    assert entry.end == entry.base + entry.size
    with pytest.raises(LLMException):
        imports.locate(entry.base)
    with pytest.raises(KeyError):
        imports.remove("a")
    imports.add("a2", entry.base, entry.size)
    assert imports.locate(entry.base + 5) == ("a2", 5)
