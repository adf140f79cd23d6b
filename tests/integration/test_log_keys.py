"""JSON log lines of a real daemon carry request_id, session, cluster, link and
status as keys of their own."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from hixl_client import CacheDesc, CacheKey, DataType, LLMDataDist, LLMException, LLMRole
from tests.clusters import cluster_info

from .conftest import daemon_process, options

pytestmark = pytest.mark.asyncio


async def test_json_records_carry_the_keys(next_cluster_id: Callable[[], int]) -> None:
    with daemon_process(logging__format="json", logging__level="DEBUG") as daemon:
        prompt = LLMDataDist(LLMRole.PROMPT, next_cluster_id(), daemon=daemon.client_target)
        decoder = LLMDataDist(LLMRole.DECODER, next_cluster_id(), daemon=daemon.client_target)
        await prompt.init(options())
        await decoder.init(options())
        try:
            await decoder.link_clusters([cluster_info(prompt.cluster_id, daemon.peer_address)],
                                        timeout=5000)
            # A link to a cluster nobody holds: a warning with the link and its status.
            await decoder.link_clusters([cluster_info(next_cluster_id(), daemon.peer_address)],
                                        timeout=2000)
            dst = await decoder.cache_manager.allocate_cache(
                CacheDesc(2, [1, 64], DataType.DT_UINT8))
            with pytest.raises(LLMException):
                await decoder.cache_manager.pull_cache(CacheKey(prompt.cluster_id, 5), dst)
        finally:
            await decoder.finalize()
            await prompt.finalize()
        log = daemon.log_path.read_text()
    records = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    assert records, log[-2000:]

    def having(**expected: object) -> list[dict[str, object]]:
        return [r for r in records if all(r.get(k) == v for k, v in expected.items())]

    decoder_id, prompt_id = decoder.cluster_id, prompt.cluster_id
    attached = [r for r in records if str(r["msg"]).startswith("session ") and "session" in r]
    assert attached and all(str(r["msg"]).split()[1] == r["session"] for r in attached)
    (init,) = having(cluster=decoder_id, msg=f"cluster {decoder_id} initialized (DECODER)")
    assert init["session"] and init["request_id"] != "-"
    (linked,) = [r for r in having(cluster=decoder_id, link=f"{decoder_id}->{prompt_id}")
                 if "linked to" in str(r["msg"])]
    assert linked["session"] == init["session"]
    assert having(cluster=prompt_id, link=f"{decoder_id}->{prompt_id}")  # the inbound side
    failed_link = [r for r in records if r.get("status") == "LLM_LINK_FAILED"
                   and r.get("cluster") == decoder_id and "link" in r]
    assert failed_link and failed_link[-1]["level"] == "WARNING"
    pulls = [r for r in records if str(r["msg"]).startswith("PullCache failed")]
    assert pulls and pulls[-1]["status"] == "LLM_KV_CACHE_NOT_EXIST"
    assert pulls[-1]["session"] == init["session"] and pulls[-1]["request_id"] != "-"
