"""Hosts for multi-replica tests: Linux network namespaces this test run creates, or loopback.

Each host is a namespace with its own network stack, joined to the others by a veth pair into a
bridge in the client's namespace (where the router and the load generator run). Addresses are in
10.213.0.0/24, which exists only inside these namespaces: no traffic ever leaves the machine, and
nothing is configured in the test runner's own namespace. Names carry the runner's pid, so two
runs never meet. Creating namespaces needs CAP_NET_ADMIN; without it ``available()`` says why,
and the tests fall back to ``LoopbackHosts`` (every host is 127.0.0.1, on its own port).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from typing import Optional

SUBNET = "10.213.0"


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


def available() -> Optional[str]:
    """None when namespaces can be made here, else the reason they cannot."""
    if shutil.which("ip") is None:
        return "no `ip` command (iproute2)"
    probe = f"rlprobe{os.getpid()}"
    try:
        _ip("netns", "add", probe)
    except subprocess.CalledProcessError as e:
        return f"cannot create a network namespace: {e.stderr.decode().strip()}"
    _ip("netns", "del", probe)
    return None


class NetnsHosts:
    """A client namespace (router, load generator) and ``count`` host namespaces."""

    def __init__(self, count: int) -> None:
        tag = f"rl{os.getpid()}"
        self.client_ns = f"{tag}c"
        self.client_addr = f"{SUBNET}.1"
        self.host_ns = [f"{tag}h{i}" for i in range(count)]
        self.host_addrs = [f"{SUBNET}.{10 + i}" for i in range(count)]
        self._made: list[str] = []

    def __enter__(self) -> "NetnsHosts":
        try:
            self._make(self.client_ns)
            _ip("-n", self.client_ns, "link", "add", "br0", "type", "bridge")
            _ip("-n", self.client_ns, "addr", "add", f"{self.client_addr}/24", "dev", "br0")
            _ip("-n", self.client_ns, "link", "set", "br0", "up")
            for i, (ns, addr) in enumerate(zip(self.host_ns, self.host_addrs)):
                self._make(ns)
                # both ends are created inside the client namespace, then one moves to the host
                _ip("-n", self.client_ns, "link", "add", f"v{i}", "type", "veth", "peer", "name", f"e{i}")
                _ip("-n", self.client_ns, "link", "set", f"e{i}", "netns", ns)
                _ip("-n", self.client_ns, "link", "set", f"v{i}", "master", "br0", "up")
                _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", f"e{i}")
                _ip("-n", ns, "link", "set", f"e{i}", "up")
        except BaseException:
            self.__exit__()
            raise
        return self

    def _make(self, ns: str) -> None:
        _ip("netns", "add", ns)
        self._made.append(ns)
        _ip("-n", ns, "link", "set", "lo", "up")

    def __exit__(self, *exc: object) -> None:
        for ns in reversed(self._made):  # deleting a namespace removes its veth ends with it
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
        self._made.clear()

    def in_client(self, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.client_ns, *argv]

    def on_host(self, i: int, argv: list[str]) -> list[str]:
        """``argv`` run in host ``i``; ``ip netns exec`` execs it, so the process's pid is the
        program's own (a test can kill it)."""
        return ["ip", "netns", "exec", self.host_ns[i], *argv]


class LoopbackHosts:
    """The same interface on 127.0.0.1, for runners that cannot create namespaces."""

    def __init__(self, count: int) -> None:
        self.client_addr = "127.0.0.1"
        self.host_addrs = ["127.0.0.1"] * count

    def __enter__(self) -> "LoopbackHosts":
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def in_client(self, argv: list[str]) -> list[str]:
        return argv

    def on_host(self, i: int, argv: list[str]) -> list[str]:
        return argv
