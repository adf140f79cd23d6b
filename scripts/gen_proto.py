"""Generate the protobuf and gRPC stubs of proto/ into hixl_wire/_proto.

Run `python scripts/gen_proto.py` after editing a .proto file; `--check`
regenerates into a temporary directory and exits 1 when the committed stubs
are stale (CI runs it through the test suite).
"""

from __future__ import annotations

import argparse
import filecmp
import re
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "proto"
OUT_ROOT = ROOT / "hixl_wire" / "_proto"
PACKAGE_PREFIX = "hixl_wire._proto."


def generate(out_root: Path) -> list[Path]:
    """Run protoc on every .proto file and return the generated files."""
    from grpc_tools import protoc  # the tool is a dev/test dependency only

    sources = sorted(str(p.relative_to(PROTO_ROOT)) for p in PROTO_ROOT.rglob("*.proto"))
    args = [
        "protoc",
        f"-I{PROTO_ROOT}",
        f"--python_out={out_root}",
        f"--pyi_out={out_root}",
        f"--grpc_python_out={out_root}",
        *sources,
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    generated = sorted(p for p in out_root.rglob("*") if p.suffix in (".py", ".pyi"))
    for path in generated:
        _rewrite_imports(path)
    return generated


def _rewrite_imports(path: Path) -> None:
    # protoc writes imports relative to the proto root ("from hixl.v1 import");
    # the stubs live inside hixl_wire, so make them absolute.
    text = path.read_text()
    text = re.sub(r"^from hixl\.v1 import", f"from {PACKAGE_PREFIX}hixl.v1 import", text,
                  flags=re.MULTILINE)
    text = re.sub(r"^import hixl\.v1\.", f"import {PACKAGE_PREFIX}hixl.v1.", text,
                  flags=re.MULTILINE)
    path.write_text(text)


def check() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        fresh = generate(Path(tmp))
        stale = []
        for path in fresh:
            committed = OUT_ROOT / path.relative_to(tmp)
            if not committed.exists() or not filecmp.cmp(path, committed, shallow=False):
                stale.append(str(committed.relative_to(ROOT)))
    if stale:
        print("stale generated stubs (run scripts/gen_proto.py):", *stale, sep="\n  ")
        return 1
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true",
                        help="fail if the committed stubs are stale")
    args = parser.parse_args()
    if args.check:
        return check()
    generate(OUT_ROOT)
    return 0


if __name__ == "__main__":
    sys.exit(main())
