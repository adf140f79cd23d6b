"""Finding and loading CANN: success against the double, and the
"HCCL backend unavailable" reasons where it cannot load."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.ascend.conftest import child_env

if TYPE_CHECKING:
    from hixl_native import _ascend as ascend
else:
    ascend = pytest.importorskip("hixl_native._ascend")


PREFIX = "HCCL backend unavailable: "


def test_load_from_explicit_dir(runtime: ascend.AscendRuntime, double_dir: Path) -> None:
    assert ascend.probe(double_dir) is None
    assert ascend.load(double_dir) is runtime
    assert ascend.load() is runtime
    acl, hccl = runtime.paths
    assert Path(acl) == double_dir / "libascendcl.so"
    assert Path(hccl) == double_dir / "libhccl.so"
    assert runtime.features == {
        "sync_timeout", "ipc", "batch_send_recv", "recent_error_message", "bare_tgid",
        "error_string", "stream_abort", "rank_table", "root_info_config", "physical_device_id",
        "one_sided", "host_register", "host_pin", "soc_info",
    }
    assert runtime.device_count() == 2
    assert not runtime.closed


def test_wrong_dir_is_unavailable(runtime: ascend.AscendRuntime, tmp_path: Path) -> None:
    reason = ascend.probe(tmp_path)
    assert reason is not None and reason.startswith(PREFIX)
    assert str(tmp_path / "libascendcl.so") in reason
    with pytest.raises(ascend.AscendUnavailable) as caught:
        ascend.load(tmp_path)
    assert str(caught.value) == reason
    assert caught.value.reason == reason[len(PREFIX):]


def test_missing_hccl_is_unavailable(runtime: ascend.AscendRuntime, double_dir: Path,
                                     tmp_path: Path) -> None:
    (tmp_path / "libascendcl.so").symlink_to(double_dir / "libascendcl.so")
    reason = ascend.probe(tmp_path)
    assert reason is not None and "libhccl.so" in reason


def test_library_without_entry_points(runtime: ascend.AscendRuntime, tmp_path: Path) -> None:
    src = tmp_path / "empty.c"
    src.write_text("int hixl_not_cann(void) { return 0; }\n")
    for name in ("libascendcl.so", "libhccl.so"):
        subprocess.run([shutil.which("gcc") or "cc", "-shared", "-fPIC", "-o", str(tmp_path / name), str(src)],
                       check=True, timeout=60)
    reason = ascend.probe(tmp_path)
    assert reason is not None and "lacks the entry point aclInit" in reason


def test_another_cann_while_loaded(runtime: ascend.AscendRuntime, tmp_path: Path) -> None:
    from tests.cann_double.build import build

    other = build(tmp_path / "other")
    reason = ascend.probe(other)
    assert reason is not None and "already loaded" in reason
    with pytest.raises(ascend.AscendUnavailable, match="already loaded"):
        ascend.load(other)


def test_search_order_without_cann(double_dir: Path, tmp_path: Path) -> None:
    """A process without CANN anywhere: every candidate is reported, in order;
    then $ASCEND_TOOLKIT_HOME/lib64 is found ahead of $ASCEND_HOME_PATH."""
    code = (
        "import sys; from hixl_native import _ascend as a\n"
        "print(a.probe())\n"
        "try:\n    a.load()\nexcept a.AscendUnavailable as e:\n    print('raised', e.reason)\n"
    )
    empty = tmp_path / "empty"
    (empty / "lib64").mkdir(parents=True)
    env = child_env(ASCEND_TOOLKIT_HOME=str(empty), ASCEND_HOME_PATH=str(tmp_path / "none"),
                    LD_LIBRARY_PATH="")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=60, check=True)
    probed, raised = done.stdout.splitlines()
    if probed == "None":
        pytest.skip("CANN is installed on this machine's default loader path")
    assert probed.startswith(PREFIX)
    assert probed.index("$ASCEND_TOOLKIT_HOME") < probed.index("$ASCEND_HOME_PATH") \
        < probed.index("default loader path")
    assert raised == "raised " + probed[len(PREFIX):]

    (empty / "lib64").rmdir()
    (empty / "lib64").symlink_to(double_dir)
    code = "from hixl_native import _ascend as a; rt = a.load(); print(rt.paths[0]); rt.finalize()"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=60, check=True)
    assert done.stdout.strip() == str(double_dir / "libascendcl.so")


def test_set_device_errors(runtime: ascend.AscendRuntime) -> None:
    with pytest.raises(ascend.AclError) as caught:
        runtime.set_device(2)
    assert caught.value.code == 107001
    assert caught.value.api == "aclrtSetDevice"
    assert "device 2 does not exist" in caught.value.detail
    with pytest.raises(ValueError):
        runtime.set_device(-1)
    with pytest.raises(TypeError):
        runtime.set_device("0")  # type: ignore[arg-type]
    assert runtime.set_device(1) is runtime.set_device(1)


def test_objects_come_from_factories(runtime: ascend.AscendRuntime) -> None:
    with pytest.raises(TypeError):
        ascend.AscendRuntime(None)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        ascend.DeviceBuffer()
    with pytest.raises(TypeError):
        ascend.Stream()


def test_errors_pickle() -> None:
    import pickle

    err = pickle.loads(pickle.dumps(ascend.HcclError(21, "HcclSend", "error cqe")))
    assert (type(err), err.code, err.api, err.detail) == (ascend.HcclError, 21, "HcclSend",
                                                           "error cqe")
    assert str(err) == "HcclSend failed with HCCL error 21: error cqe"
    gone = pickle.loads(pickle.dumps(ascend.AscendUnavailable("no CANN")))
    assert str(gone) == "HCCL backend unavailable: no CANN"


def test_finalize_in_a_child(double_dir: Path) -> None:
    code = (
        "from hixl_native import _ascend as a\n"
        f"rt = a.load({str(double_dir)!r}); d = rt.set_device(0); b = d.malloc(1)\n"
        "try:\n    rt.finalize()\nexcept RuntimeError as e:\n    print('refused', e)\n"
        "b.close(); rt.finalize(); print(rt.closed, d.closed)\n"
        "rt2 = a.load(); print(rt2 is not rt, rt2.set_device(1).id)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], env=child_env(), capture_output=True,
                          text=True, timeout=60, check=True)
    lines = done.stdout.splitlines()
    assert lines[0] == "refused devices [0] still have open buffers, streams or communicators"
    assert lines[1:] == ["True True", "True 1"]
