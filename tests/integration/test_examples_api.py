"""Every API example runs end to end with small sizes and verifies its bytes.

Each example starts its own two daemons, so they run as subprocesses, exactly
as a user runs them (``python examples/X.py ...``).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# script -> small-size flags (every example prints a "verified ..." line)
EXAMPLES: dict[str, list[str]] = {
    "pull_cache.py": ["--requests", "3", "--layers", "2", "--tokens", "32"],
    "pull_blocks.py": ["--requests", "2", "--prompt-tokens", "40", "--layers", "2",
                       "--num-blocks", "16"],
    "push_cache.py": ["--requests", "2", "--layers", "2", "--tokens", "32"],
    "push_blocks.py": ["--prompt-tokens", "48", "--shared-tokens", "20", "--layers", "2",
                       "--num-blocks", "16"],
    "layerwise_transfer.py": ["--layers", "4", "--tokens", "32", "--layer-ms", "5"],
    "swap_blocks.py": ["--prompt-tokens", "40", "--layers", "2", "--num-blocks", "8",
                       "--host-blocks", "4"],
    "register_memory.py": ["--requests", "2", "--layers", "2", "--tokens", "32"],
    "sync_facade.py": ["--requests", "3", "--layers", "2", "--tokens", "32"],
    # issue 20's conformance example: the connectors' sequence, unchanged
    "engine_connector.py": ["--requests", "4", "--layers", "3", "--num-blocks", "24"],
}


def run_example(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(ROOT / "examples" / script), *args],
                          capture_output=True, text=True, timeout=90, check=False, cwd=ROOT)


@pytest.mark.parametrize("script", sorted(EXAMPLES))
def test_example_runs_and_verifies(script: str) -> None:
    done = run_example(script, *EXAMPLES[script])
    report = f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    assert done.returncode == 0, report
    assert any(line.startswith("verified ") for line in done.stdout.splitlines()), report
    assert "Traceback" not in done.stderr, report


def test_every_example_is_listed_and_documents_its_flags() -> None:
    scripts = {p.name for p in (ROOT / "examples").glob("*.py")} - {"prefill_decode.py", "_common.py"}
    assert scripts == set(EXAMPLES)  # a new example gets a test here
    readme = (ROOT / "examples" / "README.md").read_text(encoding="utf-8")
    for script, args in EXAMPLES.items():
        assert f"`{script}`" in readme, script
        source = (ROOT / "examples" / script).read_text(encoding="utf-8")
        for flag in (a for a in args if a.startswith("--")):  # argparse shows it in --help
            assert f'add_argument("{flag}"' in source, (script, flag)


def test_help_describes_the_example() -> None:
    done = run_example("layerwise_transfer.py", "--help")
    assert done.returncode == 0, done.stderr
    assert "LayerSynchronizer" in done.stdout and "--layer-ms" in done.stdout
