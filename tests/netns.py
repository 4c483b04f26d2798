"""Test hosts in network namespaces on one bridge: several machines on one, for tests of what crosses a
network (addresses, cut links, capped links). Needs root and iproute2 (tests/run.sh installs it).

Each host has one veth link into a bridge, an address 10.201.X.H/24 and a default route through that link,
as a machine on a LAN has. A fault is a link set down (cut) or a tbf qdisc (bandwidth cap): tc netem is
missing on these kernels.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


class Network:
    """Hosts 1..n in namespaces, bridged by a switch namespace."""

    def __init__(self, hosts: int) -> None:
        self.tag = f"p2p{os.getpid() % 100000}"
        self.hosts = list(range(1, hosts + 1))
        self.switch = f"{self.tag}sw"

    def ns(self, host: int) -> str:
        return f"{self.tag}h{host}"

    def addr(self, host: int) -> str:
        return f"10.201.{os.getpid() % 200}.{host}"

    def on(self, host: int) -> list[str]:
        """The command prefix that runs a program on host."""
        return ["ip", "netns", "exec", self.ns(host)]

    def link(self, host: int, up: bool) -> None:
        """Cut host off the network (up=False) or give it back its link."""
        ip("-n", self.switch, "link", "set", f"{self.tag}b{host}", "up" if up else "down")

    def cap(self, host: int, rate: str) -> None:
        """Cap what host sends to rate (e.g. '2mbit') with a token bucket filter."""
        subprocess.run(["ip", "netns", "exec", self.ns(host), "tc", "qdisc", "add", "dev", f"{self.tag}v{host}",
                        "root", "tbf", "rate", rate, "burst", "32kbit", "latency", "400ms"], check=True,
                       capture_output=True)

    def create(self) -> None:
        ip("netns", "add", self.switch)
        ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        ip("-n", self.switch, "link", "set", "br0", "up")
        for h in self.hosts:
            ip("netns", "add", self.ns(h))
            ip("link", "add", f"{self.tag}v{h}", "type", "veth", "peer", "name", f"{self.tag}b{h}")
            ip("link", "set", f"{self.tag}v{h}", "netns", self.ns(h))
            ip("link", "set", f"{self.tag}b{h}", "netns", self.switch)
            ip("-n", self.switch, "link", "set", f"{self.tag}b{h}", "master", "br0")
            ip("-n", self.switch, "link", "set", f"{self.tag}b{h}", "up")
            ip("-n", self.ns(h), "addr", "add", f"{self.addr(h)}/24", "dev", f"{self.tag}v{h}")
            ip("-n", self.ns(h), "link", "set", f"{self.tag}v{h}", "up")
            ip("-n", self.ns(h), "link", "set", "lo", "up")
            ip("-n", self.ns(h), "route", "add", "default", "dev", f"{self.tag}v{h}")
        # Start the hosts' programs only once every link carries traffic (both veth ends up, bridge too).
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not all(
            "state UP" in subprocess.run(["ip", "-n", self.ns(h), "link", "show", f"{self.tag}v{h}"],
                                         capture_output=True, text=True).stdout for h in self.hosts):
            time.sleep(0.1)

    def destroy(self) -> None:
        for h in self.hosts:
            subprocess.run(["ip", "netns", "del", self.ns(h)], capture_output=True)
        subprocess.run(["ip", "netns", "del", self.switch], capture_output=True)


@contextmanager
def network(hosts: int) -> Iterator[Network]:
    """A network of test hosts, removed afterwards whatever happens."""
    if os.geteuid() != 0 or not shutil.which("ip"):
        pytest.fail("multihost tests need root and iproute2 (ip netns); bash tests/run.sh installs iproute2")
    net = Network(hosts)
    try:
        net.create()
        yield net
    finally:
        net.destroy()
