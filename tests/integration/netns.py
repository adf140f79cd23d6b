"""Two network namespaces joined by a veth pair, for partition tests.

A test makes them, runs one daemon in each (``DaemonProcess(netns=...)``),
cuts the network between them and heals it, and removes them. The cuts
this kernel allows (it has no netem):

* ``drop()``: nftables drops every packet between the two, a silent
  partition (the carrier stays up, nothing answers);
* ``link_down()``: one end of the veth pair goes down, as a pulled cable.

Unix sockets are not in a network namespace, so the test's clients reach
both daemons as usual.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

_TABLE = "hixl_partition"


def _run(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True, timeout=20)


class NetnsPair:
    """Namespaces ``a`` and ``b``; ``a_ip`` and ``b_ip`` are their addresses."""

    def __init__(self, index: int = 0) -> None:
        tag = f"hixl{os.getpid() % 100000}x{index}"
        self.a, self.b = f"{tag}a", f"{tag}b"
        self._veth_a, self._veth_b = f"{tag}va", f"{tag}vb"
        subnet = 10 + (os.getpid() + index) % 200
        self.a_ip, self.b_ip = f"10.231.{subnet}.1", f"10.231.{subnet}.2"
        self._made: list[str] = []

    @staticmethod
    def skip_unless_possible() -> None:
        """Skip the test, saying why, where namespaces or nftables are not at hand."""
        if os.geteuid() != 0:
            pytest.skip("partition tests make network namespaces: they need root")
        for tool in ("ip", "nft"):
            if shutil.which(tool) is None:
                pytest.skip(f"partition tests need {tool!r} (iproute2, nftables); "
                            f"not installed here")

    def create(self) -> NetnsPair:
        try:
            for name in (self.a, self.b):
                _run("ip", "netns", "add", name)
                self._made.append(name)
            _run("ip", "link", "add", self._veth_a, "netns", self.a, "type", "veth", "peer",
                 "name", self._veth_b, "netns", self.b)
            for ns, veth, ip in ((self.a, self._veth_a, self.a_ip),
                                 (self.b, self._veth_b, self.b_ip)):
                _run("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", veth)
                _run("ip", "-n", ns, "link", "set", veth, "up")
                _run("ip", "-n", ns, "link", "set", "lo", "up")
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as exc:
            self.close()
            stderr = getattr(exc, "stderr", b"") or b""
            pytest.skip(f"cannot make network namespaces here: {exc} "
                        f"{stderr.decode(errors='replace').strip()}")
        return self

    def drop(self) -> None:
        """Drop every packet between the two namespaces, silently, both ways."""
        for ns, other in ((self.a, self.b_ip), (self.b, self.a_ip)):
            _run("ip", "netns", "exec", ns, "nft", "add", "table", "inet", _TABLE)
            for chain, hook, field in (("in", "input", "saddr"), ("out", "output", "daddr")):
                _run("ip", "netns", "exec", ns, "nft", "add", "chain", "inet", _TABLE, chain,
                     f"{{ type filter hook {hook} priority 0; policy accept; }}")
                _run("ip", "netns", "exec", ns, "nft", "add", "rule", "inet", _TABLE, chain,
                     "ip", field, other, "drop")

    def undrop(self) -> None:
        for ns in (self.a, self.b):
            _run("ip", "netns", "exec", ns, "nft", "delete", "table", "inet", _TABLE)

    def link_down(self) -> None:
        _run("ip", "-n", self.a, "link", "set", self._veth_a, "down")

    def link_up(self) -> None:
        _run("ip", "-n", self.a, "link", "set", self._veth_a, "up")

    def close(self) -> None:
        """Remove both namespaces (the veth pair goes with them)."""
        while self._made:
            name = self._made.pop()
            subprocess.run(("ip", "netns", "del", name), capture_output=True, timeout=20,
                           check=False)
