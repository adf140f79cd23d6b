"""Builds the CANN test double (libascendcl.so and libhccl.so) with gcc.

Usage: ``python -m tests.cann_double.build OUT_DIR`` or `build(out_dir)`.
The double is for tests only; see ``tests/cann_double/__init__.py``.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ACL_SOURCES = ("acl_double.c", "acl_double_ipc.c", "acl_double_stream.c",
               "acl_double_context.c", "acl_double_pinned.c")
HCCL_SOURCES = ("hccl_double.c",)
# HcclRegisterGlobalMem ... HcclBatchGet: left out of a build with one_sided=False
HCCL_ONE_SIDED_SOURCES = ("hccl_double_onesided.c",)
HEADERS = ("cann_double.h", "acl_double_internal.h", "hccl_double_internal.h")
CFLAGS = (
    "-std=gnu11",
    "-O1",
    "-g",
    "-Wall",
    "-Wextra",
    "-Wno-unused-parameter",
    "-fPIC",
    "-shared",
    "-fvisibility=hidden",
    "-pthread",
)


class BuildError(RuntimeError):
    """gcc failed; the message holds its output."""


def _gcc(args: list[str]) -> None:
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        raise BuildError("no C compiler (gcc) on PATH")
    done = subprocess.run([cc, *args], capture_output=True, text=True, check=False, timeout=120)
    if done.returncode != 0:
        raise BuildError(f"{' '.join(args)}\n{done.stdout}{done.stderr}")


def build(out_dir: str | Path, *, werror: bool = False, one_sided: bool = True) -> Path:
    """Compile the double into ``out_dir`` (created if needed).

    Args:
        out_dir: Directory that receives ``libascendcl.so`` and ``libhccl.so``.
        werror: Treat warnings as errors (for working on the double itself;
            off by default so that a newer gcc's new warning fails no test run).
        one_sided: Include HCCL's one-sided entry points. Without them the
            double is a CANN whose libhccl.so lacks those symbols, which is
            how tests run hixl's two-sided fallback.

    Returns:
        The directory, as an absolute path.

    Raises:
        BuildError: gcc is missing or a compilation failed.
    """
    flags = [*CFLAGS, "-Werror"] if werror else list(CFLAGS)
    out = Path(out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    acl = out / "libascendcl.so"
    _gcc([*flags, "-Wl,-soname,libascendcl.so", "-o", str(acl),
          *(str(HERE / s) for s in ACL_SOURCES)])
    # libhccl.so needs the double's libascendcl.so (streams, memory, faults);
    # $ORIGIN finds it next to itself when loaded by path.
    _gcc([*flags, "-Wl,-soname,libhccl.so", "-Wl,-rpath,$ORIGIN", "-o", str(out / "libhccl.so"),
          *(str(HERE / s) for s in HCCL_SOURCES),
          *(str(HERE / s) for s in (HCCL_ONE_SIDED_SOURCES if one_sided else ())),
          f"-L{out}", "-lascendcl"])
    return out


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a not in ("--werror", "--no-one-sided")]
    if len(args) != 1:
        sys.exit("usage: python -m tests.cann_double.build [--werror] [--no-one-sided] OUT_DIR")
    print(build(args[0], werror="--werror" in sys.argv,
                one_sided="--no-one-sided" not in sys.argv))
