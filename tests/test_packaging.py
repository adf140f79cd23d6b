"""Packaging: what goes into the wheel and the sdist, and the metadata.

Building and repairing the real wheel compiles the native extension in a
fresh environment (minutes), so CI does that as its own step
(``scripts/build_wheel.sh`` from ``.ci/run``, which checks the files with
``scripts/check_dist.py``). Here: the configuration that decides those
files, and the checker itself on wheel and sdist listings.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def check_dist() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_dist", ROOT / "scripts" / "check_dist.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_license_and_metadata() -> None:
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text
    project = PYPROJECT["project"]
    assert project["license"] == "Apache-2.0" and project["license-files"] == ["LICENSE"]
    classifiers = project["classifiers"]
    assert "Operating System :: POSIX :: Linux" in classifiers
    assert f"Programming Language :: Python :: {project['requires-python'][2:]}" in classifiers
    # PEP 639: a license expression and a license classifier do not go together
    assert not [c for c in classifiers if c.startswith("License ::")]
    assert {"Homepage", "Source", "Issues", "Documentation"} <= project["urls"].keys()


def test_wheel_carries_no_sources() -> None:
    setuptools = PYPROJECT["tool"]["setuptools"]
    # MANIFEST.in brings the sources into the sdist; they must not ride into the wheel
    assert setuptools["include-package-data"] is False
    for package, patterns in setuptools["package-data"].items():
        for pattern in patterns:
            assert not pattern.endswith((".c", ".h", ".pyx", ".pxi")), (package, pattern)


def test_sdist_manifest_carries_docs_deploy_examples() -> None:
    manifest = (ROOT / "MANIFEST.in").read_text().splitlines()
    for line in ("recursive-include docs *.md", "recursive-include deploy *",
                 "recursive-include examples *.py *.md", "include setup.py LICENSE",
                 "prune bench"):
        assert line in manifest, line


def test_checker_on_wheel_listings() -> None:
    checker = check_dist()
    good = ["hixl_client/__init__.py", "hixl_service/__init__.py", "hixl_wire/__init__.py",
            "hixl_native/__init__.py", "hixl_native/_core.cpython-311-x86_64-linux-gnu.so",
            "hixl_native/_ascend.cpython-311-x86_64-linux-gnu.so", "hixl_native/_core.pyi",
            "hixl.libs/libcrypto-0123abcd.so.3", "hixl-0.1.0.dist-info/licenses/LICENSE"]
    name = "hixl-0.1.0-cp311-cp311-manylinux_2_34_x86_64.whl"
    assert checker.wheel_problems(good, name) == []
    bad = [n for n in good if not n.endswith("LICENSE")] + ["hixl_native/_core.c",
                                                            "hixl_native/_core.pyx"]
    assert checker.wheel_problems(bad, name) == [
        "hixl_native/_core.c: a source file in the wheel",
        "hixl_native/_core.pyx: a source file in the wheel",
        "no LICENSE under .dist-info/licenses/"]


def test_checker_on_sdist_listings() -> None:
    checker = check_dist()
    listing = [f"hixl-0.1.0/{path}" for path in checker.SDIST_MUST_HAVE]
    assert checker.sdist_problems(listing) == []
    assert checker.sdist_problems([n for n in listing if "deploy/" not in n]) == [
        "deploy/README.md: missing from the sdist", "deploy/hixl.service: missing from the sdist",
        "deploy/k8s/hixl-daemonset.yaml: missing from the sdist"]
    for path in checker.SDIST_MUST_HAVE:
        assert (ROOT / path).is_file(), path
