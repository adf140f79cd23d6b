"""Daemon configuration: sources, precedence, validation and error messages."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from pydantic import ByteSize, ValidationError

from hixl_service.config import (
    ConfigError,
    DaemonConfig,
    LoggingConfig,
    PoolConfig,
    ServerConfig,
    TransferConfig,
    dump_toml,
    load_config,
)

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib


def write(tmp_path: Path, text: str, name: str = "hixl.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_defaults() -> None:
    from hixl_wire.defaults import default_socket_path

    config = load_config(None, env={})
    assert config.server == ServerConfig()
    assert config.server.client_socket == default_socket_path()
    assert config.server.client_tcp is None
    assert (config.server.peer_host, config.server.peer_port) == ("127.0.0.1", 26000)
    assert config.server.data_port == 0
    assert config.server.advertise_host is None
    assert config.server.effective_advertise_host == "127.0.0.1"
    assert config.server.max_concurrent_rpcs == 256
    assert config.server.grace_period_s == 5.0
    assert config.server.use_uvloop is True
    assert config.server.ready_file is None
    assert config.pool == PoolConfig(backend="host", max_bytes=ByteSize(1 << 30), populate=True)
    assert config.transfer == TransferConfig(
        streams_per_link=4, connect_timeout_s=3.0, copy_threads=2
    )
    assert config.logging == LoggingConfig(level="INFO", format="text")


def test_models_are_frozen() -> None:
    config = load_config(None, env={})
    with pytest.raises(ValidationError):
        config.server.peer_port = 1
    with pytest.raises(ValidationError):
        config.pool = PoolConfig()


def test_toml_file(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        [server]
        client_socket = "/run/hixl-test/h.sock"
        peer_port = 26001
        advertise_host = "node-a"
        grace_period_s = 2.5
        [pool]
        max_bytes = "64MiB"
        populate = false
        [transfer]
        streams_per_link = 8
        [logging]
        level = "debug"
        format = "json"
        """,
    )
    config = load_config(path, env={})
    assert config.server.client_socket == Path("/run/hixl-test/h.sock")
    assert config.server.peer_port == 26001
    assert config.server.effective_advertise_host == "node-a"
    assert config.server.grace_period_s == 2.5
    assert config.pool.max_bytes == 64 << 20
    assert config.pool.populate is False
    assert config.transfer.streams_per_link == 8
    assert config.transfer.copy_threads == 2
    assert config.logging.level == "DEBUG"
    assert config.logging.format == "json"


def test_env_beats_toml_and_merges_per_field(tmp_path: Path) -> None:
    path = write(tmp_path, "[server]\npeer_port = 26001\ndata_port = 26100\n")
    env = {"HIXL_SERVER__PEER_PORT": "26002", "HIXL_POOL__MAX_BYTES": "2GiB"}
    config = load_config(path, env=env)
    assert config.server.peer_port == 26002
    assert config.server.data_port == 26100
    assert config.pool.max_bytes == 2 << 30


def test_env_names_are_case_insensitive() -> None:
    config = load_config(None, env={"hixl_transfer__copy_threads": "5"})
    assert config.transfer.copy_threads == 5


def test_env_section_as_json() -> None:
    config = load_config(None, env={"HIXL_TRANSFER": '{"streams_per_link": 16}'})
    assert config.transfer.streams_per_link == 16


def test_env_reads_given_mapping_not_process_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HIXL_SERVER__PEER_PORT", "1")
    assert load_config(None, env={}).server.peer_port == 26000
    assert load_config(None).server.peer_port == 1


def test_client_variables_are_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    env = {"HIXL_DAEMON": "unix:/somewhere/hixl.sock", "HIXL_TRANSFER_LANE": "0",
           "HIXL_TEST_LOOP": "asyncio", "HIXL_DOUBLE_FAULTS": "x"}
    assert load_config(None, env=env) == load_config(None, env={})
    monkeypatch.setenv("HIXL_DAEMON", "127.0.0.1:1")
    assert DaemonConfig().server.peer_port == 26000


@pytest.mark.parametrize(
    ("name", "hint"),
    [
        ("HIXL_SERVER_PEER_PORT", "did you mean $HIXL_SERVER__PEER_PORT?"),  # one underscore
        ("HIXL_BOGUS__X", ""),
        ("HIXL_DAEMON__X", ""),  # HIXL_DAEMON is the client's; this is neither
        ("HIXL_OTHER", ""),
        ("hixl_pol__max_bytes", ""),
    ],
)
def test_unknown_variable_is_an_error_naming_it(name: str, hint: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, env={name: "1", "HIXL_DAEMON": "unix:/x.sock"})
    message = str(info.value)
    assert f"${name}: unknown variable" in message
    assert hint in message
    assert len(info.value.problems) == 1


def test_every_unknown_variable_is_named() -> None:
    env = {"HIXL_SERVER_PEER_PORT": "1", "HIXL_POOL_MAX_BYTES": "2GiB", "HIXL_POOL__MAX_BYTES": "1GiB"}
    with pytest.raises(ConfigError) as info:
        load_config(None, env=env)
    assert [p.split(":")[0] for p in info.value.problems] == ["$HIXL_POOL_MAX_BYTES",
                                                              "$HIXL_SERVER_PEER_PORT"]


def test_unknown_key_in_file_is_named(tmp_path: Path) -> None:
    path = write(tmp_path, "[pool]\nmax_bytez = 1\n")
    with pytest.raises(ConfigError) as info:
        load_config(path, env={})
    message = str(info.value)
    assert "pool.max_bytez: Extra inputs are not permitted" in message
    assert str(path) in message
    assert info.value.path == path
    assert info.value.problems == ("pool.max_bytez: Extra inputs are not permitted",)


def test_unknown_section_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="serverr: Extra inputs"):
        load_config(write(tmp_path, "[serverr]\npeer_port = 1\n"), env={})


def test_unknown_key_in_env_is_named() -> None:
    with pytest.raises(ConfigError, match=r"server\.bogus: .*\$HIXL_SERVER__BOGUS"):
        load_config(None, env={"HIXL_SERVER__BOGUS": "1"})


@pytest.mark.parametrize(
    ("section", "field", "value", "reason"),
    [
        ("pool", "max_bytes", 0, "greater than 0"),
        ("pool", "max_bytes", "lots", "could not parse"),
        ("pool", "backend", "gpu", "'host' or 'hccl'"),
        ("ascend", "devices", [], "at least 1 item"),
        ("ascend", "devices", [0, 0], "device ids repeat"),
        ("ascend", "device_pool_max_bytes", 0, "greater than 0"),
        ("server", "peer_port", 65536, "less than or equal to 65535"),
        ("server", "data_port", -1, "greater than or equal to 0"),
        ("server", "max_concurrent_rpcs", 0, "greater than 0"),
        ("server", "grace_period_s", 0, "greater than 0"),
        ("server", "grace_period_s", "nan", "finite number"),
        ("server", "client_tcp", "nohost", "host:port"),
        ("server", "client_tcp", "h:99999", "host:port"),
        ("server", "client_socket", "relative.sock", "absolute path"),
        ("server", "client_socket", "/" + "s" * 120, "unix socket path"),
        ("server", "peer_host", "", "at least 1 character"),
        ("transfer", "streams_per_link", 0, "greater than or equal to 1"),
        ("transfer", "streams_per_link", 65, "less than or equal to 64"),
        ("transfer", "copy_threads", 65, "less than or equal to 64"),
        ("transfer", "connect_timeout_s", -1.0, "greater than 0"),
        ("logging", "level", "TRACE", "'DEBUG'"),
        ("logging", "format", "xml", "'text'"),
    ],
)
def test_bad_value_names_field_and_file(
    tmp_path: Path, section: str, field: str, value: object, reason: str
) -> None:
    path = write(tmp_path, dump_toml({section: {field: value}}))
    with pytest.raises(ConfigError) as info:
        load_config(path, env={})
    message = str(info.value)
    assert f"{section}.{field}: " in message
    assert reason in message
    assert str(path) in message


def test_negative_device_id_is_named(tmp_path: Path) -> None:
    path = write(tmp_path, dump_toml({"ascend": {"devices": [0, -1]}}))
    with pytest.raises(ConfigError, match=r"ascend\.devices\.1: .*greater than or equal to 0"):
        load_config(path, env={})


def test_hccl_backend_settings_round_trip(tmp_path: Path) -> None:
    env = {"HIXL_POOL__BACKEND": "hccl", "HIXL_ASCEND__DEVICES": "[2, 3]",
           "HIXL_ASCEND__DEVICE_POOL_MAX_BYTES": "2GiB"}
    config = load_config(None, env=env)
    assert config.pool.backend == "hccl"
    assert config.ascend.devices == [2, 3]
    assert config.ascend.device_pool_max_bytes == 2 << 30
    assert config.ascend.cann_path is None
    again = load_config(write(tmp_path, config.to_toml()), env={})
    assert again.ascend == config.ascend


def test_bad_env_value_names_variable() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, env={"HIXL_POOL__MAX_BYTES": "0"})
    assert "pool.max_bytes: Input should be greater than 0" in str(info.value)
    assert "$HIXL_POOL__MAX_BYTES" in str(info.value)


def test_several_errors_are_all_reported() -> None:
    env = {"HIXL_SERVER__PEER_PORT": "-5", "HIXL_TRANSFER__COPY_THREADS": "0"}
    with pytest.raises(ConfigError) as info:
        load_config(None, env=env)
    assert [p.split(":")[0] for p in info.value.problems] == [
        "server.peer_port",
        "transfer.copy_threads",
    ]


def test_no_client_listener_is_rejected() -> None:
    with pytest.raises(ConfigError, match="server: no client listener"):
        load_config(None, env={"HIXL_SERVER__CLIENT_SOCKET": ""})


def test_tcp_only_client_listener() -> None:
    env = {"HIXL_SERVER__CLIENT_SOCKET": "", "HIXL_SERVER__CLIENT_TCP": "127.0.0.1:0"}
    config = load_config(None, env=env)
    assert config.server.client_socket is None
    assert config.server.client_tcp == "127.0.0.1:0"


def test_peer_and_data_port_must_differ() -> None:
    with pytest.raises(ConfigError, match="peer_port and data_port must differ"):
        load_config(None, env={"HIXL_SERVER__DATA_PORT": "26000"})
    env = {"HIXL_SERVER__PEER_PORT": "0", "HIXL_SERVER__DATA_PORT": "0"}
    assert load_config(None, env=env).server.data_port == 0


def test_wildcard_peer_host_needs_advertise_host() -> None:
    with pytest.raises(ConfigError, match="advertise_host"):
        load_config(None, env={"HIXL_SERVER__PEER_HOST": "0.0.0.0"})
    env = {"HIXL_SERVER__PEER_HOST": "::", "HIXL_SERVER__ADVERTISE_HOST": "10.0.0.7"}
    assert load_config(None, env=env).server.effective_advertise_host == "10.0.0.7"


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "absent.toml"
    with pytest.raises(ConfigError, match="no such file") as info:
        load_config(path, env={})
    assert str(path) in str(info.value)


def test_directory_is_not_a_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such file"):
        load_config(tmp_path, env={})


def test_unparseable_file(tmp_path: Path) -> None:
    path = write(tmp_path, "[server\npeer_port = = 1\n")
    with pytest.raises(ConfigError, match="cannot load configuration") as info:
        load_config(path, env={})
    assert str(path) in str(info.value)


def test_unparseable_env_json() -> None:
    with pytest.raises(ConfigError, match="server"):
        load_config(None, env={"HIXL_SERVER": "{not json"})


def test_to_toml_round_trips(tmp_path: Path) -> None:
    env = {
        "HIXL_SERVER__CLIENT_SOCKET": "",
        "HIXL_SERVER__CLIENT_TCP": "[::1]:7000",
        "HIXL_SERVER__READY_FILE": str(tmp_path / "ready.json"),
        "HIXL_POOL__MAX_BYTES": "3GiB",
        "HIXL_LOGGING__LEVEL": "warning",
    }
    config = load_config(None, env=env)
    text = config.to_toml()
    assert 'client_socket = ""' in text
    assert "max_bytes = 3221225472" in text
    assert load_config(write(tmp_path, text), env={}) == config


def test_dump_toml_values() -> None:
    data = {
        "a": {
            "s": 'q"uo\\te\n\x7f\tü',
            "i": 3,
            "f": 0.25,
            "big": 1e300,
            "inf": float("inf"),
            "b": False,
            "p": Path("/x y"),
            "n": None,
        }
    }
    parsed = tomllib.loads(dump_toml(data))
    assert parsed == {
        "a": {
            "s": 'q"uo\\te\n\x7f\tü',
            "i": 3,
            "f": 0.25,
            "big": 1e300,
            "inf": float("inf"),
            "b": False,
            "p": "/x y",
            "n": "",
        }
    }
    assert tomllib.loads(dump_toml({"a": {"x": [1, "b"], "e": []}})) == {"a": {"x": [1, "b"],
                                                                             "e": []}}
    # mappings are inline tables (security.allowed_peers is a list of them)
    peers = [{"identity": "spiffe://x/y", "clusters": [1, 2], "write": True}]
    assert tomllib.loads(dump_toml({"security": {"allowed_peers": peers}})) == {
        "security": {"allowed_peers": peers}}
    # a dict (ascend.device_ips) becomes an inline table
    assert tomllib.loads(dump_toml({"a": {"x": {0: "10.0.0.1"}, "e": {}}})) == {
        "a": {"x": {"0": "10.0.0.1"}, "e": {}}}
    with pytest.raises(TypeError, match="set"):
        dump_toml({"a": {"x": {1, 2}}})


DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def test_example_config_loads_and_documents_every_field(tmp_path: Path) -> None:
    text = (DEPLOY / "hixl.toml.example").read_text()
    as_is = load_config(DEPLOY / "hixl.toml.example", env={})
    assert as_is.server.client_socket == Path("/run/hixl/hixl.sock")
    # Uncommenting every "# key = value" line must give the defaults again.
    uncommented = re.sub(r"(?m)^# (\w+ = )", r"\1", text)
    parsed = tomllib.loads(uncommented)
    for section, model in DaemonConfig.model_fields.items():
        assert model.annotation is not None
        fields = set(model.annotation.model_fields)
        assert set(parsed[section]) == fields, section
    assert load_config(write(tmp_path, uncommented), env={}) == as_is


def test_unit_stops_after_the_grace_period() -> None:
    unit = (DEPLOY / "hixl.service").read_text()
    stop = re.search(r"(?m)^TimeoutStopSec=(\d+)$", unit)
    assert stop is not None
    assert int(stop.group(1)) > ServerConfig().grace_period_s
    assert "Type=notify" in unit
    assert "RestartPreventExitStatus=2" in unit


@pytest.mark.parametrize("mode", ["none", "token", "mtls"])
def test_security_examples_load(mode: str) -> None:
    config = load_config(DEPLOY / "security" / f"{mode}.toml.example", env={})
    assert config.security.mode == mode


def test_security_needs_its_files() -> None:
    with pytest.raises(ConfigError, match='mode "token" needs token_file'):
        load_config(None, env={"HIXL_SECURITY__MODE": "token"})
    with pytest.raises(ConfigError, match="tls_cert, tls_key, tls_ca"):
        load_config(None, env={"HIXL_SECURITY__MODE": "mtls"})
    peers = '[{"identity": "a", "write": true}]'
    config = load_config(None, env={"HIXL_SECURITY__ALLOWED_PEERS": peers})
    assert config.security.allowed_peers[0].write
