"""listen_ip_info as the daemon reads it, and when a cluster shares the daemon's port.

The listeners themselves run against real daemons in
tests/integration/test_listen_ip_info.py.
"""

from __future__ import annotations

import grpc.aio
import pytest

from hixl_client.status import LLMException, LLMStatusCode
from hixl_service.cluster import ClusterSettings
from hixl_service.cluster_listeners import (
    DaemonPort,
    ListenAddress,
    PeerListeners,
    parse_listen_ip_info,
)
from hixl_service.testing import unused_port


@pytest.mark.parametrize(("text", "expected"), [
    ("", None),
    ("127.0.0.1:26000", ListenAddress("127.0.0.1", 26000)),
    ("10.1.2.3:1", ListenAddress("10.1.2.3", 1)),
    ("[::1]:65535", ListenAddress("::1", 65535)),
])
def test_good_values_parse(text: str, expected: ListenAddress | None) -> None:
    assert parse_listen_ip_info(text) == expected
    if expected is not None:
        assert str(expected) == text


@pytest.mark.parametrize(("text", "message"), [
    ("127.0.0.1", "'ip:port'"),
    (":26000", "'ip:port'"),
    ("127.0.0.1:", "1..65535"),
    ("127.0.0.1:0", "1..65535"),
    ("127.0.0.1:65536", "1..65535"),
    ("127.0.0.1:-1", "1..65535"),
    ("127.0.0.1:26x", "1..65535"),
    ("host.example:26000", "not an IP address"),
    ("0.0.0.0:26000", "wildcard"),
    ("[::]:26000", "wildcard"),
])
def test_bad_values_are_refused(text: str, message: str) -> None:
    with pytest.raises(LLMException, match=message) as raised:
        parse_listen_ip_info(text)
    assert raised.value.status_code == LLMStatusCode.LLM_PARAM_INVALID


def test_the_settings_carry_the_address() -> None:
    settings = ClusterSettings.from_options({"llm.listenIpInfo": "127.0.0.1:26001"})
    assert settings.listen == ListenAddress("127.0.0.1", 26001)
    assert ClusterSettings.from_options({}).listen is None
    with pytest.raises(LLMException, match="1..65535"):
        ClusterSettings.from_options({"llm.listenIpInfo": "127.0.0.1:0"})


def _listeners(daemon_port: DaemonPort) -> PeerListeners:
    return PeerListeners(lambda cluster_id: grpc.aio.server(), None, "none", False, daemon_port)


@pytest.mark.asyncio
async def test_the_daemons_own_port_is_shared_not_opened() -> None:
    listeners = _listeners(DaemonPort("127.0.0.1", "127.0.0.1", 26123))
    shared = await listeners.open(1, ListenAddress("127.0.0.1", 26123))
    assert (shared.address, shared.shared) == ("127.0.0.1:26123", True)
    await shared.close()
    # A wildcard daemon port is every address of this host at that port.
    anywhere = _listeners(DaemonPort("0.0.0.0", "10.9.8.7", 26123))
    assert (await anywhere.open(1, ListenAddress("127.0.0.1", 26123))).shared


@pytest.mark.asyncio
async def test_an_opened_listener_holds_its_port_until_closed() -> None:
    port = unused_port()
    listeners = _listeners(DaemonPort("127.0.0.1", "127.0.0.1", 1))
    listener = await listeners.open(1, ListenAddress("127.0.0.1", port))
    assert not listener.shared
    with pytest.raises(LLMException, match="already in use"):
        await listeners.open(2, ListenAddress("127.0.0.1", port))
    await listener.close()
    again = await listeners.open(3, ListenAddress("127.0.0.1", port))
    await again.close()
