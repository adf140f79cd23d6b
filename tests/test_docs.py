"""The docs point at things that exist: relative links and repository paths.

Every Markdown file of the repository is read. A relative link
(``[text](path#anchor)``) must name a file or directory, relative to the
file it is in; an in-page anchor must name a heading of that file. A code
span that names a repository path (``deploy/hixl.service``,
``tests/integration/test_examples.py``) must name one that exists, so a
document cannot point at a file that left the repository or never was in it.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SKIP_DIRS = {".venv", ".git", "build", "dist", ".pytest_cache", ".mypy_cache", ".ruff_cache"}
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")
CODE_SPAN = re.compile(r"`([^`\n]+)`")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
# Top-level entries whose paths the docs name in code spans.
TOP = ("bench/", "deploy/", "docs/", "examples/", "hixl_client/", "hixl_native/", "hixl_service/",
       "hixl_wire/", "native/", "proto/", "scripts/", "tests/", ".ci/", "../")
PATH_SPAN = re.compile(r"^[\w./-]+\.(md|py|sh|toml|yaml|yml|json|proto|pyx|c|h|service|example|png|txt)$")


def markdown_files() -> list[Path]:
    return sorted(p for p in ROOT.rglob("*.md")
                  if not SKIP_DIRS & set(p.relative_to(ROOT).parts)
                  and not any(part.endswith(".egg-info") for part in p.parts))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to dashes."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    return {slug(m.group(1)) for m in re.finditer(r"^#+\s+(.*)$", text, re.M)}


def problems_of(path: Path, root: Path = ROOT) -> list[str]:
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    where = path.relative_to(root)
    problems = []
    for match in LINK.finditer(text):
        target = match.group(1) or match.group(2)
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        linked = (path.parent / file_part).resolve() if file_part else path
        if not linked.exists():
            problems.append(f"{where}: link to {target}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            problems.append(f"{where}: link to {target}: no such heading")
    for match in CODE_SPAN.finditer(text):
        span = match.group(1).strip()
        if not span.startswith(TOP) or not PATH_SPAN.match(span):
            continue
        base = path.parent if span.startswith("../") else root
        if not (base / span).exists() and not (path.parent / span).exists():
            problems.append(f"{where}: names `{span}`, which is not in the repository")
    return problems


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_links_and_paths_exist(path: Path) -> None:
    assert problems_of(path) == []


def test_the_checker_finds_dead_links(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "here.md").write_text("# Here\n")
    page = tmp_path / "README.md"
    page.write_text("# Operating hixl\n\n## systemd: readiness, watchdog\n"
                    "[ok](docs/here.md#here) [ok](#operating-hixl) [ok](#systemd-readiness-watchdog)\n"
                    "[gone](docs/gone.md) [bad anchor](docs/here.md#there) [web](https://x.invalid/y)\n"
                    "`docs/here.md` `../shared/spec/llm_datadist.md` `tests/none.py`\n"
                    "```\n[in a fence](nowhere.md)\n```\n")
    assert problems_of(page, tmp_path) == [
        "README.md: link to docs/gone.md: no such file",
        "README.md: link to docs/here.md#there: no such heading",
        "README.md: names `../shared/spec/llm_datadist.md`, which is not in the repository",
        "README.md: names `tests/none.py`, which is not in the repository",
    ]
