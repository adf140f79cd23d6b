"""The Security page's commands (docs/security.md) work as written: run in a
fresh shell from the checkout, after the README's setup commands (the .venv
they make)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def security_blocks() -> list[str]:
    text = (ROOT / "docs" / "security.md").read_text(encoding="utf-8")
    return re.findall(r"```bash\n(.*?)```", text, re.S)


def test_security_page_commands_run_as_written() -> None:
    if not (ROOT / ".venv" / "bin" / "grpcurl").exists() or shutil.which("openssl") is None:
        pytest.skip("needs openssl and grpcurl (the test extra) in .venv")
    blocks = security_blocks()
    assert len(blocks) == 3
    for leftover in ("/tmp/hixl-tls", "/tmp/hixl-token"):
        shutil.rmtree(leftover, ignore_errors=True)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/")}
    done = subprocess.run(["bash", "-e", "-c", "\n".join(blocks)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "configuration OK" in done.stdout
    assert '"SERVING"' in done.stdout
    assert "refused: TLS only" in done.stdout
