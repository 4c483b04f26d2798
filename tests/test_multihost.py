"""Several hosts in network namespaces on one bridge: a bootstrap and nodes on different addresses.

One host is cut off from the network and another's node is killed; the rest notice and carry on, and
the cut-off host is taken back when its link returns. A bootstrap bound to a wildcard is reachable from
the other hosts. Needs root and iproute2 (CI has both).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import p2pfed, peer_states, status, stop, wait_for
from tests.netns import Network, network

pytestmark = pytest.mark.multihost


@pytest.fixture
def net() -> Iterator[Network]:
    with network(4) as n:
        yield n


def configs(tmp_path: Path) -> tuple[Path, Path]:
    timing = "heartbeat = 0.5\nsuspect_after = 3\ndead_after = 6\n"
    cfg = tmp_path / "node.toml"
    cfg.write_text(f"[node]\n[node.mesh]\n{timing}")
    boot_cfg = tmp_path / "bootstrap.toml"
    boot_cfg.write_text(f"[bootstrap]\n[bootstrap.mesh]\n{timing}")
    return cfg, boot_cfg


def test_hosts_form_a_mesh_and_survive_a_cut_link_and_a_killed_node(net: Network, tmp_path: Path) -> None:
    cfg, boot_cfg = configs(tmp_path)
    boot_addr = f"tcp://{net.addr(1)}:7000"
    procs = {1: p2pfed("bootstrap", "--bind", boot_addr, "--config", str(boot_cfg), log=tmp_path / "h1.log",
                       prefix=net.on(1))}
    for h in net.hosts[1:]:
        procs[h] = p2pfed("node", "--join", boot_addr, "--bind", "tcp://0.0.0.0:7100", "--name", f"node{h}",
                          "--config", str(cfg), log=tmp_path / f"h{h}.log", prefix=net.on(h))
    names = {"bootstrap", "node2", "node3", "node4"}
    try:
        def seen_from(h: int, address: str, member: str = "bootstrap") -> dict[str, str]:
            return peer_states(status(address, member=member, prefix=net.on(h)))

        wait_for(lambda: seen_from(2, boot_addr) == dict.fromkeys(names, "alive"), 60, "the mesh to form")
        # every node advertises its own host's address, not the wildcard it bound
        st = status(boot_addr, prefix=net.on(2)) or {}
        assert {p["name"]: p["address"] for p in st["peers"]}["node3"] == f"tcp://{net.addr(3)}:7100"
        # a node sees the others directly, not only through the bootstrap
        node2 = f"tcp://{net.addr(2)}:7100"
        wait_for(lambda: seen_from(2, node2, "node2") == dict.fromkeys(names, "alive"), 30, "node2's view")

        net.link(4, up=False)  # host 4 is cut off
        stop(procs[3], sig=signal.SIGKILL)  # node 3's process dies
        wait_for(lambda: seen_from(2, node2, "node2") == {"bootstrap": "alive", "node2": "alive", "node3": "dead",
                                                 "node4": "dead"},
                 30, "node2 to notice")
        wait_for(lambda: seen_from(1, boot_addr) == {"bootstrap": "alive", "node2": "alive", "node3": "dead",
                                                     "node4": "dead"}, 30, "the bootstrap to notice")
        assert procs[1].poll() is None and procs[2].poll() is None  # the rest carry on

        net.link(4, up=True)  # the link returns: host 4 is taken back
        wait_for(lambda: seen_from(2, node2, "node2").get("node4") == "alive", 30, "node4 to be back")
    finally:
        stop(*procs.values())


def test_a_bootstrap_bound_to_a_wildcard_advertises_a_routable_address(net: Network, tmp_path: Path) -> None:
    # This machine's host name maps to 127.0.0.1 (as in many /etc/hosts): advertising what it resolves to made
    # the bootstrap dead to every other host after a few seconds, and nodes joining through it never met.
    cfg, boot_cfg = configs(tmp_path)
    procs = [p2pfed("bootstrap", "--bind", "tcp://0.0.0.0:7000", "--config", str(boot_cfg),
                    log=tmp_path / "h1.log", prefix=net.on(1))]
    boot = f"tcp://{net.addr(1)}:7000"
    procs += [p2pfed("node", "--join", boot, "--bind", "tcp://0.0.0.0:7100", "--name", f"node{h}", "--config",
                     str(cfg), log=tmp_path / f"h{h}.log", prefix=net.on(h)) for h in (2, 3)]
    names = {"bootstrap", "node2", "node3"}
    try:
        def seen_from(h: int) -> dict[str, str]:
            return peer_states(status(f"tcp://{net.addr(h)}:7100", member=f"node{h}", prefix=net.on(h)))

        wait_for(lambda: seen_from(2) == dict.fromkeys(names, "alive"), 60, "node2 to see everyone alive")
        st = status(boot, prefix=net.on(3)) or {}
        assert st["peers"][0]["name"] == "bootstrap" and st["peers"][0]["address"] == boot
        wait_for(lambda: seen_from(3) == dict.fromkeys(names, "alive"), 30, "node3 to see everyone alive")
        assert "127." not in (tmp_path / "h1.log").read_text()
    finally:
        stop(*procs)


def test_the_manuals_cross_machine_recipe_works_as_written(net: Network, tmp_path: Path) -> None:
    # The commands of docs/deploy.md, run as written on three hosts (A, B, C) and asked from a fourth, each with a key
    # folder of its own as separate machines have: only the tickets the members print join them. Its host
    # names are this network's addresses, KEY and KEY_OF_B the keys that A and B print.
    page = (Path(__file__).resolve().parents[1] / "docs" / "deploy.md").read_text()
    block = page.split("## Run a mesh across machines", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    commands = [line.split() for line in block.splitlines() if line.startswith("p2pfed ")]
    assert [c[1] for c in commands] == ["bootstrap", "node", "node", "mesh"]
    hosts = {"A": 1, "B": 2, "C": 3}
    printed: dict[str, str] = {}

    def as_written(args: list[str]) -> list[str]:
        text = " ".join(args[1:])
        for name, h in hosts.items():
            text = text.replace(f"tcp://{name}:", f"tcp://{net.addr(h)}:")
        return text.replace("KEY_OF_B", printed.get("B", "?")).replace("KEY", printed.get("A", "?")).split()

    node_cfg, boot_cfg = configs(tmp_path)  # faster heartbeats than the defaults, nothing else

    def start(args: list[str], h: int) -> subprocess.Popen[bytes]:
        env = {**os.environ, "P2PFED_HOME": str(tmp_path / f"host{h}")}
        log = open(tmp_path / f"h{h}.log", "wb")  # noqa: SIM115 - closed with the process
        cfg = boot_cfg if args[1] == "bootstrap" else node_cfg
        return subprocess.Popen([*net.on(h), sys.executable, "-m", "p2pfed", *as_written(args), "--config",
                                 str(cfg)], stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)

    def key_printed(h: int) -> str:
        wait_for(lambda: "join it with --join" in (tmp_path / f"h{h}.log").read_text(), 30, f"host {h}'s ticket")
        line = next(x for x in (tmp_path / f"h{h}.log").read_text().splitlines() if "join it with --join" in x)
        return line.rsplit("/", 1)[1]

    procs = [start(commands[0], 1)]
    try:
        printed["A"] = key_printed(1)
        procs.append(start(commands[1], 2))
        printed["B"] = key_printed(2)
        procs.append(start(commands[2], 3))
        env = {**os.environ, "P2PFED_HOME": str(tmp_path / "host4")}

        def seen() -> dict[str, str]:
            res = subprocess.run([*net.on(4), sys.executable, "-m", "p2pfed", *as_written(commands[3]), "--json",
                                  "--timeout", "2"], capture_output=True, timeout=30, env=env)
            return peer_states(json.loads(res.stdout)) if res.returncode == 0 else {}

        wait_for(lambda: seen() == {"bootstrap": "alive", "node-b": "alive", "node-c": "alive"}, 60,
                 "the manual's mesh to form, seen from a fourth host")
        assert not list((tmp_path / "host4").glob("keys/*.key_secret"))  # asking made no member of the asker
    finally:
        stop(*procs)
