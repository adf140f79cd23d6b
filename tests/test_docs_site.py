"""The documentation site builds strictly, with the command its page gives.

docs/getting-started.md gives the build command (`.venv/bin/mkdocs build
--strict ...`); it runs here as written in a fresh shell, as the commands of
tests/integration/test_readme_commands.py do. `--strict` (and `strict: true`
in mkdocs.yml) turns every warning into a failure: a page left out of the
nav, a link or anchor that leads nowhere, an API reference that names no
object. mkdocs comes with the docs extra, which scripts/setup.sh installs
with the test extra, so CI always has it: a missing mkdocs fails, it is not
skipped.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FRESH_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": os.environ.get("HOME", "/root"),
             "LANG": "C.UTF-8"}
# What the reference pages must show: one member of each documented object.
REFERENCE = {
    "reference/llm_datadist": "hixl_client.LLMDataDist.link_clusters",
    "reference/cache_manager": "hixl_client.CacheManager.pull_blocks",
    "reference/cache": "hixl_client.CacheDesc",
    "reference/keys": "hixl_client.BlocksCacheKey",
    "reference/config": "hixl_client.LLMConfig",
    "reference/memory": "hixl_client.alloc_shareable",
    "reference/status": "hixl_client.LLMStatusCode",
    "reference/sync": "hixl_client.sync.CacheManager.pull_blocks",
    "reference/vllm": "hixl_client.vllm.HixlConnector",
}


def build_command() -> tuple[str, Path]:
    """The first line of getting-started's build block, and the site directory it names."""
    text = (ROOT / "docs" / "getting-started.md").read_text(encoding="utf-8")
    match = re.search(r"^(\.venv/bin/mkdocs build --strict --site-dir (\S+).*)$", text, re.M)
    assert match is not None, "docs/getting-started.md gives no mkdocs build command"
    return match.group(1), Path(match.group(2))


def test_every_page_is_in_the_nav() -> None:
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    pages = {str(p.relative_to(ROOT / "docs")) for p in (ROOT / "docs").rglob("*.md")}
    assert pages == set(re.findall(r":\s+(\S+\.md)$", nav, re.M))


def test_site_builds_strictly_as_written() -> None:
    assert (ROOT / ".venv" / "bin" / "mkdocs").exists(), (
        "no .venv/bin/mkdocs: scripts/setup.sh installs the docs extra")
    command, site = build_command()
    shutil.rmtree(site, ignore_errors=True)
    done = subprocess.run(["bash", "-e", "-c", command], cwd=ROOT, env=FRESH_ENV,
                          capture_output=True, text=True, timeout=240, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    # strict fails on any warning already; a warning logged by a plugin that strict
    # does not count would still show as mkdocs' "WARNING -" line
    assert not re.search(r"^WARNING\s+-", done.stderr, re.M), done.stderr
    for page in ("getting-started", "client", "vllm", "porting", "daemon", "security",
                 "operating", "ascend", "benchmarks", "architecture", "testing"):
        assert (site / page / "index.html").is_file(), page
    for page, anchor in REFERENCE.items():
        html = (site / page / "index.html").read_text(encoding="utf-8")
        assert f'id="{anchor}"' in html, (page, anchor)
    shutil.rmtree(site, ignore_errors=True)
