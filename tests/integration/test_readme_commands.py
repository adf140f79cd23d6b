"""The documentation's commands work as written in a fresh shell: README.md's,
deploy/README.md's and those of every page under docs/ (the documentation site).

"Fresh" means what a reader has after the README's setup commands in a new
terminal: the checkout as the working directory, the ``.venv`` they made,
and nothing activated or exported (``env -i`` with a plain PATH).

Every shell block of those files is classified here, by its first line:
RUN blocks are run, each in its own ``bash -e``; SKIPPED blocks say why not
(they need hardware, root and systemd, a cluster, or minutes). A block of
either kind must call its programs by a path that exists in that shell:
``.venv/bin/hixl-serviced``, never a bare ``hixl-serviced``, ``grpcurl``,
``python`` or ``pip`` that a fresh shell does not have. A new block fails
``test_every_block_is_classified`` until it is added to one of the two.
README's Python example of the async client runs too, against a daemon of
its own (``test_readme_client_example_runs``).
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from hixl_service.testing import DaemonProcess

ROOT = Path(__file__).resolve().parents[2]
DOCS = ("README.md", "deploy/README.md",
        *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.md")))
FRESH_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": os.environ.get("HOME", "/root"),
             "LANG": "C.UTF-8"}
# What a fresh shell lacks: only the virtual environment has these.
VENV_ONLY = {"hixl-serviced", "hixl-bench", "hixlctl", "grpcurl", "python", "pip", "pip3",
             "pytest"}


@dataclass(frozen=True)
class Block:
    doc: str
    line: int
    text: str

    @property
    def key(self) -> str:
        return self.text.splitlines()[0].strip()


# first line -> what its output must contain
RUN = {
    ".venv/bin/hixl-serviced --check                                         # the embedded "
    "defaults: valid?": ("configuration OK (defaults and environment)",
                         "exit 2: misspelt variable"),
    "export HIXL_SERVER__CLIENT_SOCKET=/tmp/hixl-ops/hixl.sock HIXL_SERVER__PEER_PORT=26200": (
        "grpc.reflection.v1.ServerReflection", "hixl.v1.Peer", '"status": "SERVING"',
        '"daemon_id"'),
}
SKIPPED = {
    "# on each host: its daemon (see \"Running the daemon\"; here the embedded defaults)":
        "a template with the reader's model and hosts, and vLLM installed "
        "(tests/vllm/test_vllm_connector.py starts such servers: hixl_bench.vllm.pd.hixl_spec)",
    "# P and D as above, each with ...\"kv_connector_extra_config\":{\"mode\":\"push\"}...":
        "a template with the reader's hosts and two vLLM servers in push mode "
        "(tests/vllm/test_vllm_connector.py runs the proxy in both modes against such "
        "servers: hixl_bench.vllm.proxy_process)",
    "bash scripts/vllm_env.sh                                   # vLLM's CPU build, in "
    "~/.cache/hixl": "minutes: tests/vllm/test_vllm_connector.py makes that environment and "
                     "runs the servers these commands start (hixl_bench.vllm.pd.pd_setup)",
    ".venv/bin/hixlctl status                 # one screen: ids, listeners, counts, refusals":
        "needs a daemon at the default socket, and its last line stops it "
        "(tests/integration/test_hixlctl.py runs every command)",
    "bash scripts/demo.sh    # the main job: installs, then a prefill -> decode pull between "
    "two daemons": "the setup commands: the suite runs inside what they made "
                   "(tests/integration/test_examples.py runs the demo's example)",
    "bash scripts/demo.sh --tokens 8192     # the demo with a longer prompt (1 GiB of KV)":
        "the setup commands again, and a test run inside a test run "
        "(tests/integration/test_examples.py runs the demo's example with --tokens)",
    ".venv/bin/mkdocs build --strict --site-dir /tmp/hixl-site   # the site, as CI builds it":
        "tests/test_docs_site.py runs the first line as written; the second serves until "
        "stopped",
    "HIXL_TRANSFER_LANE=0 .venv/bin/python your_engine.py          # this client process":
        "your_engine.py is the reader's program; the second line serves until stopped "
        "(tests/integration/test_lane.py covers both settings)",
    ".venv/bin/python -m hixl_service.ascend.smoke --devices 0,1              # two NPUs of "
    "this host": "needs Ascend NPUs and CANN (tests/ascend/test_smoke.py runs it against the "
                 "CANN double)",
    "umask 077 && mkdir -p /tmp/hixl-token && openssl rand -hex 32 > /tmp/hixl-token/secret":
        "run by tests/integration/test_readme_security.py",
    "mkdir -p /tmp/hixl-tls && cd /tmp/hixl-tls": "run by tests/integration/test_readme_security.py",
    "HIXL_SECURITY__MODE=mtls HIXL_SECURITY__TLS_CERT=/tmp/hixl-tls/prefill.pem \\":
        "run by tests/integration/test_readme_security.py",
    "bash scripts/build_wheel.sh                                   # dist/wheelhouse/: the "
    "manylinux wheel": "needs docker and a Kubernetes cluster; the wheel build is CI's own "
                       "step (.ci/run), the manifest is checked by tests/test_deploy.py",
    ".venv/bin/pip install -e ./bench        # or -e './bench[plot]' for --plot (matplotlib)":
        "benchmark runs take minutes (tests/bench/test_bench_smoke.py runs a --quick one)",
    ".venv/bin/python -m hixl_bench.compare A1.jsonl B1.jsonl A2.jsonl B2.jsonl   # alternating "
    "runs of builds A and B": "needs the JSON lines of earlier benchmark runs "
                              "(tests/bench/test_compare.py, test_calls.py)",
    ".venv/bin/python -m hixl_bench.soak --json-out soak.json         # 20,000 transfers over "
    "64 links, 10 prompt-daemon restarts (~20 s)": "benchmark runs take minutes "
    "(tests/integration/test_soak.py and test_link_scale.py run CI-sized ones)",
    ".venv/bin/hixl-bench --suites serve --quick          # the target rows and a few more, "
    "about a minute": "benchmark runs take minutes (tests/bench/test_serve.py)",
    "sudo apt-get install -y python3-venv gcc python3-dev libssl-dev   # Debian/Ubuntu; the last "
    "three build the native part": "installs system-wide as root (/opt, /etc, a system user); "
                                   "scripts/build_wheel.sh builds what it installs",
    "sudo systemctl daemon-reload": "needs systemd as init and the installed unit "
                                    "(tests/test_deploy.py checks the unit)",
    "S=/run/hixl/hixl.sock G=/opt/hixl/venv/bin/grpcurl": "needs the installed service; the "
                                                          "same calls run in docs/operating.md's block",
}


def shell_blocks() -> list[Block]:
    blocks = []
    for doc in DOCS:
        text = (ROOT / doc).read_text(encoding="utf-8")
        for match in re.finditer(r"^```(bash|sh|shell)\n(.*?)^```", text, re.S | re.M):
            blocks.append(Block(doc, text[:match.start()].count("\n") + 1, match.group(2)))
    return blocks


def commands(text: str) -> list[str]:
    """The program each simple command of ``text`` starts (assignments skipped)."""
    programs = []
    joined = re.sub(r"\\\n", " ", text)
    for line in joined.splitlines():
        line = line.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        for part in re.split(r"&&|\|\||[|;&]", line):
            try:
                words = shlex.split(part)
            except ValueError:  # a quote spanning parts: the first word is what counts
                words = part.split()
            words = [w for w in words if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", w)]
            while words and words[0] in ("sudo", "timeout", "exec", "export", "env"):
                words = words[1:]
                if words and re.match(r"^-?\d+$", words[0]):  # timeout's seconds
                    words = words[1:]
            if words:
                programs.append(words[0])
    return programs


def test_every_block_is_classified() -> None:
    blocks = shell_blocks()
    keys = [block.key for block in blocks]
    unclassified = [f"{b.doc}:{b.line}: {b.key!r}" for b in blocks
                    if b.key not in RUN and b.key not in SKIPPED]
    assert not unclassified, "add each to RUN or SKIPPED (with the reason):\n" + "\n".join(
        unclassified)
    assert not (RUN.keys() | SKIPPED.keys()) - set(keys), "entries for blocks that are gone"
    assert len(keys) == len(set(keys)), "two blocks start with the same line"


@pytest.mark.parametrize("block", shell_blocks(), ids=lambda b: f"{b.doc}:{b.line}")
def test_programs_exist_in_a_fresh_shell(block: Block) -> None:
    for program in commands(block.text):
        assert program not in VENV_ONLY, (
            f"{block.doc}:{block.line}: `{program}` is not found in a fresh shell; write "
            f".venv/bin/{program}")
        if program.startswith(".venv/bin/"):
            assert (ROOT / program).exists(), f"{block.doc}:{block.line}: no {program}"
        if program.startswith("/opt/hixl/venv/bin/"):
            name = program.rsplit("/", 1)[1]
            # what the deploy venv gets: hixl's console scripts, pip, python, grpcurl
            assert (ROOT / ".venv" / "bin" / name).exists(), f"{block.doc}: {name}"
    if block.key in RUN:
        assert "python3 -m pip" not in block.text


def run_in_fresh_shell(text: str) -> tuple[int, str]:
    """Exit status and output of ``text`` in ``bash -e``; whatever it left running (a
    daemon started with ``&``) is killed with its process group at the end."""
    with subprocess.Popen(["bash", "-e", "-c", text], cwd=ROOT, env=FRESH_ENV,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          start_new_session=True) as shell:
        try:
            output, _ = shell.communicate(timeout=180)
        except subprocess.TimeoutExpired:
            os.killpg(shell.pid, signal.SIGKILL)
            output, _ = shell.communicate()
            return -1, output + "\n(ran past 180 s)"
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(shell.pid, signal.SIGKILL)
        return shell.returncode, output


@pytest.mark.slow
@pytest.mark.timeout(400)
@pytest.mark.parametrize("key", list(RUN), ids=lambda k: k.split()[0] + " ...")
def test_block_runs_as_written(key: str) -> None:
    if "grpcurl" in key or "grpcurl" in "".join(b.text for b in shell_blocks() if b.key == key):
        if not (ROOT / ".venv" / "bin" / "grpcurl").exists():
            pytest.skip("grpcurl (the test extra, Linux x86-64 only) is not in .venv")
    (block,) = [b for b in shell_blocks() if b.key == key]
    shutil.rmtree("/tmp/hixl-ops", ignore_errors=True)
    code, output = run_in_fresh_shell(block.text)
    assert code == 0, f"{block.doc}:{block.line} failed:\n{output[-4000:]}"
    for expected in RUN[key]:
        assert expected in output, f"{expected!r} not in:\n{output[-4000:]}"


def readme_client_example() -> str:
    """The Python block of README's "The async client" section."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text[text.index("## The async client"):]
    match = re.search(r"^```python\n(.*?)^```", section, re.S | re.M)
    assert match is not None, "README's async client section has no Python block"
    return match.group(1)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_readme_client_example_runs(tmp_path: Path) -> None:
    """README's example runs as written against a daemon with the embedded defaults
    (but for its own socket and ports, so that it meets no other daemon)."""
    example = tmp_path / "example.py"
    example.write_text(readme_client_example(), encoding="utf-8")
    with DaemonProcess() as daemon:
        done = subprocess.run([sys.executable, str(example)], cwd=ROOT,
                              env=FRESH_ENV | {"HIXL_DAEMON": daemon.client_target},
                              capture_output=True, text=True, timeout=90, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "pulled 2097152 bytes" in done.stdout, done.stdout
