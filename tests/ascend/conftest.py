"""Fixtures for the Ascend shim: the CANN test double, built once per session.

The double (``tests/cann_double``) is compiled with gcc into a temporary
directory and the shim is loaded from there; nothing here needs CANN or an
accelerator. Tests skip when the extension is not built or gcc is missing.
"""

from __future__ import annotations

import gc
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.cann_double import DoubleControl

if TYPE_CHECKING:
    from hixl_native._ascend import AscendRuntime, Device

MIB = 1 << 20
DEVICE_MEM = 64 * MIB
DEVICES = 2

# Read by the double at aclInit (and by child processes, which inherit them).
DOUBLE_ENV = {
    "HIXL_DOUBLE_DEVICE_COUNT": str(DEVICES),
    "HIXL_DOUBLE_DEVICE_MEM_BYTES": str(DEVICE_MEM),
    "HIXL_DOUBLE_CONNECT_TIMEOUT_MS": "5000",
}


def child_env(**extra: str) -> dict[str, str]:
    """Environment for a child Python process that loads the shim like we do."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ASCEND_", "HIXL_DOUBLE_"))}
    env.update(DOUBLE_ENV)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    env.update(extra)
    return env


@pytest.fixture(scope="session")
def double_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The built double: a directory with libascendcl.so and libhccl.so."""
    pytest.importorskip("hixl_native._ascend")
    if shutil.which("gcc") is None and shutil.which("cc") is None:
        pytest.skip("no C compiler to build the CANN test double")
    from tests.cann_double.build import build

    return build(tmp_path_factory.mktemp("cann_double"))


@pytest.fixture(scope="session")
def two_sided_dir(tmp_path_factory: pytest.TempPathFactory, double_dir: Path) -> Path:
    """The double without HCCL's one-sided entry points (a CANN that lacks them): daemons
    loading it fall back to the two-sided path."""
    from tests.cann_double.build import build

    return build(tmp_path_factory.mktemp("cann_double_two_sided"), one_sided=False)


@pytest.fixture(scope="session")
def runtime(double_dir: Path) -> AscendRuntime:
    """The shim loaded from the double (one per process, never finalized here)."""
    from hixl_native import _ascend

    for key, value in DOUBLE_ENV.items():
        os.environ.setdefault(key, value)
    rt = _ascend.load(double_dir)
    DoubleControl(double_dir).configure(DEVICES, DEVICE_MEM)
    return rt


@pytest.fixture
def double(runtime: AscendRuntime, double_dir: Path) -> Iterator[DoubleControl]:
    """Fault injection; every fault is disarmed after the test."""
    ctl = DoubleControl(double_dir)
    ctl.reset()
    yield ctl
    ctl.reset()
    ctl.configure(DEVICES, DEVICE_MEM)


@pytest.fixture
def device(runtime: AscendRuntime) -> Device:
    return runtime.set_device(0)


@pytest.fixture(autouse=True)
def no_ascend_leaks(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail a test that leaves shim objects (or the double's resources) behind."""
    if "runtime" not in request.fixturenames:
        yield
        return
    from hixl_native import _ascend

    ctl = DoubleControl(request.getfixturevalue("double_dir"))
    gc.collect()
    before, double_before = _ascend.live_objects(), ctl.live()
    yield
    gc.collect()
    after, double_after = _ascend.live_objects(), ctl.live()
    leaked = {k: after[k] - before[k] for k in after if after[k] > before[k]}
    assert not leaked, f"shim objects leaked: {leaked}"
    kept = {k: double_after[k] - double_before[k] for k in double_after
            if double_after[k] > double_before[k]}
    assert not kept, f"CANN resources (of the double) leaked: {kept}"
