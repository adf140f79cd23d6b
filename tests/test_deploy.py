"""The deployment files: the Kubernetes DaemonSet and the systemd unit say what they must.

The manifest is parsed (PyYAML) and its fields checked; its embedded
hixl.toml is loaded by the daemon's own configuration loader. No cluster
runs here, so this checks the manifest's content, not a rollout.
"""

from __future__ import annotations

import configparser
from pathlib import Path
from typing import Any

import pytest
import yaml

from hixl_service.config import load_config

ROOT = Path(__file__).resolve().parent.parent
MANIFEST = ROOT / "deploy" / "k8s" / "hixl-daemonset.yaml"
UNIT = ROOT / "deploy" / "hixl.service"


@pytest.fixture(scope="module")
def documents() -> dict[str, dict[str, Any]]:
    docs = [doc for doc in yaml.safe_load_all(MANIFEST.read_text()) if doc]
    return {doc["kind"]: doc for doc in docs}


@pytest.fixture(scope="module")
def pod(documents: dict[str, dict[str, Any]]) -> dict[str, Any]:
    daemonset = documents["DaemonSet"]
    assert daemonset["apiVersion"] == "apps/v1"
    template = daemonset["spec"]["template"]
    assert daemonset["spec"]["selector"]["matchLabels"].items() <= (
        template["metadata"]["labels"].items())
    spec: dict[str, Any] = template["spec"]
    return spec


def daemon_container(pod: dict[str, Any]) -> dict[str, Any]:
    (container,) = [c for c in pod["containers"] if c["name"] == "hixl-serviced"]
    return container


def embedded_config(documents: dict[str, dict[str, Any]], tmp_path: Path) -> Any:
    path = tmp_path / "hixl.toml"
    path.write_text(documents["ConfigMap"]["data"]["hixl.toml"])
    return load_config(path, env={"HIXL_SERVER__ADVERTISE_HOST": "10.0.0.7"})


def test_host_network_and_socket_directory(pod: dict[str, Any],
                                           documents: dict[str, dict[str, Any]],
                                           tmp_path: Path) -> None:
    assert pod["hostNetwork"] is True
    assert pod["dnsPolicy"] == "ClusterFirstWithHostNet"
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["name"]: m["mountPath"] for m in daemon_container(pod)["volumeMounts"]}
    assert volumes["sockets"]["hostPath"]["path"] == "/run/hixl"
    config = embedded_config(documents, tmp_path)
    assert config.server.client_socket.parent == Path(mounts["sockets"])
    # the directory is made the daemon user's, 0750, before the daemon starts
    (prepare,) = pod["initContainers"]
    assert "install -d -m 0750 -o 10001" in " ".join(prepare["command"])
    assert pod["securityContext"]["runAsUser"] == 10001


def test_shared_memory_and_memlock(pod: dict[str, Any]) -> None:
    container = daemon_container(pod)
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert volumes[mounts["/dev/shm"]]["emptyDir"]["medium"] == "Memory"
    assert "IPC_LOCK" in container["securityContext"]["capabilities"]["add"]


def test_resources_cover_the_pool_budget(pod: dict[str, Any],
                                         documents: dict[str, dict[str, Any]],
                                         tmp_path: Path) -> None:
    resources = daemon_container(pod)["resources"]
    assert {"cpu", "memory"} <= resources["requests"].keys()
    limit = resources["limits"]["memory"]
    assert limit.endswith("Gi")
    budget = embedded_config(documents, tmp_path).pool.max_bytes
    assert int(limit[:-2]) << 30 > budget


def test_probes_use_grpc_health_on_the_peer_port(pod: dict[str, Any],
                                                 documents: dict[str, dict[str, Any]],
                                                 tmp_path: Path) -> None:
    container = daemon_container(pod)
    config = embedded_config(documents, tmp_path)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"peer": config.server.peer_port, "data": config.server.data_port,
                     "peer-lane": config.server.peer_lane_port}
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert container[probe]["grpc"]["port"] == config.server.peer_port, probe
    # the peer port answers for the Peer service only (not for hixl.v1.Client)
    assert container["readinessProbe"]["grpc"]["service"] == "hixl.v1.Peer"
    assert "service" not in container["livenessProbe"]["grpc"]
    # kubelet's gRPC probes speak plaintext: no mtls on the port they check
    assert config.security.mode != "mtls"


def test_daemon_runs_from_the_virtual_environment(pod: dict[str, Any]) -> None:
    assert daemon_container(pod)["command"][0] == "/opt/hixl/venv/bin/hixl-serviced"
    dockerfile = (MANIFEST.parent / "Dockerfile").read_text()
    assert "python3 -m venv /opt/hixl/venv" in dockerfile


def unit_service() -> configparser.SectionProxy:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string(UNIT.read_text())
    return parser["Service"]


def test_unit_watchdog_reload_and_venv() -> None:
    service = unit_service()
    assert service["Type"] == "notify"
    assert int(service["WatchdogSec"]) > 0
    assert service["ExecReload"] == "/bin/kill -HUP $MAINPID"
    assert service["ExecStart"].startswith("/opt/hixl/venv/bin/hixl-serviced ")
