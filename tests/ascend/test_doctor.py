"""hixlctl doctor on the hccl backend (the CANN double): it names a link's
slower path than the hardware offers."""

from __future__ import annotations

import asyncio
import itertools
import json
import subprocess
import sys
from pathlib import Path

import pytest

from hixl_client import LLMDataDist, LLMRole, LLMStatusCode
from hixl_service.testing import DaemonProcess

from .daemons import cluster_info, daemon_process, options

pytestmark = pytest.mark.asyncio

_ids = itertools.count(9100)


async def doctor(daemon: DaemonProcess) -> dict[str, dict[str, str]]:
    done = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "hixl_service.ctl", "--daemon",
                         daemon.client_target, "-o", "json", "doctor"],
        capture_output=True, text=True, timeout=120, check=False)
    assert done.stdout, done.stderr
    return {row["check"]: row for row in json.loads(done.stdout)}


async def _link(prompt_daemon: DaemonProcess, decoder_daemon: DaemonProcess,
                decoder_device: int) -> tuple[LLMDataDist, LLMDataDist]:
    prompt = LLMDataDist(LLMRole.PROMPT, next(_ids), daemon=prompt_daemon.client_target)
    decoder = LLMDataDist(LLMRole.DECODER, next(_ids), daemon=decoder_daemon.client_target)
    await prompt.init(options(device_id=0))
    await decoder.init(options(device_id=decoder_device))
    status, results = await decoder.link_clusters(
        [cluster_info(prompt.cluster_id, prompt_daemon.peer_address)], timeout=5000)
    assert status == LLMStatusCode.LLM_SUCCESS, results
    return prompt, decoder


async def test_two_sided_hccl_is_a_slower_path_than_the_hardware_offers(
        double_dir: Path, runtime: object) -> None:
    env = {"HIXL_DOUBLE_ONE_SIDED": "0"}  # the double refuses the one-sided API
    with daemon_process("hccl", double_dir, env) as prompt_daemon, \
            daemon_process("hccl", double_dir, env) as decoder_daemon:
        prompt, decoder = await _link(prompt_daemon, decoder_daemon, 1)
        try:
            found = await doctor(decoder_daemon)
        finally:
            await decoder.finalize()
            await prompt.finalize()
    name = f"link {decoder.cluster_id}->{prompt.cluster_id}"
    assert found[name]["detail"].startswith("hccl, two-sided")
    assert "device memory: not self-tested" in found[name]["detail"]
    path = found[f"{name} path"]
    assert path["result"] == "warn"
    assert "slower path than the hardware offers" in path["detail"]
