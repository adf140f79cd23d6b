"""Check hixl's release files: what a wheel and an sdist must and must not carry.

Usage: python scripts/check_dist.py WHEEL_OR_SDIST...

A wheel carries the packages, their stubs and the compiled extensions, its
LICENSE, and no C or Cython sources (the sdist has those); a manylinux wheel
names a manylinux platform. An sdist carries the sources the wheel is built
from plus the docs, deploy/ and examples/. Exits 1 naming every problem.
"""

from __future__ import annotations

import sys
import tarfile
import zipfile
from collections.abc import Iterable
from pathlib import Path

# Under the sdist's top directory.
SDIST_MUST_HAVE = (
    "LICENSE", "README.md", "pyproject.toml", "setup.py", "MANIFEST.in",
    "docs/architecture.md", "deploy/README.md", "deploy/hixl.service",
    "deploy/k8s/hixl-daemonset.yaml", "examples/README.md", "examples/prefill_decode.py",
    "native/hixl_native/_core.pyx", "native/hixl_native/csrc/pool.c",
    "proto/hixl/v1/client.proto",
)
WHEEL_FORBIDDEN_SUFFIXES = (".c", ".h", ".pyx", ".pxi", ".html")


def wheel_problems(names: Iterable[str], wheel_name: str) -> list[str]:
    """What is wrong with a wheel whose archive lists ``names``."""
    names = list(names)
    problems = [f"{name}: a source file in the wheel" for name in names
                if name.endswith(WHEEL_FORBIDDEN_SUFFIXES)]
    if not any(name.endswith(".dist-info/licenses/LICENSE") for name in names):
        problems.append("no LICENSE under .dist-info/licenses/")
    for module in ("hixl_native/_core", "hixl_native/_ascend"):
        if not any(name.startswith(module) and name.endswith(".so") for name in names):
            problems.append(f"no compiled {module} extension")
    for package in ("hixl_client", "hixl_service", "hixl_wire", "hixl_native"):
        if f"{package}/__init__.py" not in names:
            problems.append(f"no {package} package")
    if "manylinux" in wheel_name and not any(".libs/" in name for name in names):
        problems.append("repaired, yet no shared library grafted under hixl.libs/ (libcrypto)")
    return problems


def sdist_problems(names: Iterable[str]) -> list[str]:
    """What is missing from an sdist whose archive lists ``names``."""
    inside = {name.split("/", 1)[1] for name in names if "/" in name}
    problems = [f"{path}: missing from the sdist" for path in SDIST_MUST_HAVE
                if path not in inside]
    problems += [f"{path}: hixl-bench is its own distribution" for path in inside
                 if path.startswith("bench/")]
    return problems


def check(path: Path) -> list[str]:
    if path.suffix == ".whl":
        with zipfile.ZipFile(path) as wheel:
            problems = wheel_problems(wheel.namelist(), path.name)
        if "manylinux" not in path.name:
            problems.append("not tagged manylinux (run auditwheel repair)")
        return problems
    with tarfile.open(path) as sdist:
        return sdist_problems(sdist.getnames())


def main(argv: list[str]) -> int:
    if not argv:
        sys.stderr.write(__doc__ or "")
        return 2
    failed = False
    for arg in argv:
        problems = check(Path(arg))
        for problem in problems:
            sys.stderr.write(f"{arg}: {problem}\n")
        failed = failed or bool(problems)
        if not problems:
            print(f"{arg}: OK")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
