"""Several hosts in network namespaces on one bridge: a bootstrap and nodes on different addresses.

One host is cut off from the network and another's node is killed; the rest notice and carry on, and
the cut-off host is taken back when its link returns. A bootstrap bound to a wildcard is reachable from
the other hosts. Needs root and iproute2 (CI has both).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import p2pfed, peer_states, status, stop, wait_for
from tests.netns import Network, network

pytestmark = pytest.mark.multihost
ROOT = Path(__file__).resolve().parents[1]


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


RAY_HOSTS = {"A": 1, "B": 2, "C": 3}


def ray_recipe(block: str) -> list[list[str]]:
    """A docs/ray.md block's commands (the lines that are no comment), each split into words."""
    page = (ROOT / "docs" / "ray.md").read_text()
    text = page.split(f"<!-- recipe: {block} -->", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    return [line.split() for line in text.replace("\\\n", " ").splitlines() if line and not line.startswith("#")]


def as_written(net: Network, args: list[str]) -> list[str]:
    """A recipe's words on this network: A, B and C (alone, or before :PORT or :PATH) are the hosts' addresses."""
    return [re.sub(r"(^|=)([ABC])(?=:|$)", lambda m: m[1] + net.addr(RAY_HOSTS[m[2]]), a) for a in args]


@contextmanager
def ray_cluster(net: Network, tmp_path: Path, hidden: Path) -> Iterator[dict[str, str]]:
    """docs/ray.md's cluster of three machines, its lines before the run done as written on hosts A, B and C: the
    exports set the environment every machine and the driver get (yielded), the token is made on A (the hosts
    share one home folder, so it is on B and C too), and each `ray start` runs with --block, so that the test holds
    its process and ends it. Host C does not see the folder hidden (a tmpfs over it in C's own mount namespace,
    as on a machine without a shared file system)."""
    lines = ray_recipe("ray-cluster")[:-1]
    env = {**os.environ, "HOME": str(tmp_path / "home")}
    for line in [line for line in lines if line[0] == "export"]:
        key, _, value = line[1].partition("=")
        env[key] = value
    assert env.get("RAY_AUTH_MODE") == "token"  # the recipe's cluster is not open to anyone on the network
    lines = [line for line in lines if line[0] != "export"]
    assert [line[:2] for line in lines] == [["ray", "get-auth-token"]] + [["ray", "start"]] * 3
    ray_cli = str(Path(sys.executable).with_name("ray"))
    subprocess.run([*net.on(1), ray_cli, *lines[0][1:]], check=True, capture_output=True, env=env, timeout=60)
    procs = []
    try:
        for args, h in zip(lines[1:], [1, 2, 3], strict=True):
            command = " ".join([ray_cli, *as_written(net, args)[1:], "--block"])
            if h == 3:
                command = f"mount -t tmpfs tmpfs {hidden} && exec {command}"
            log = open(tmp_path / f"ray-h{h}.log", "wb")  # noqa: SIM115 - closed with the process
            host_env = {**env, "P2PFED_HOME": str(tmp_path / f"home{h}")}  # a machine's own key home
            procs.append(subprocess.Popen([*net.on(h), "sh", "-c", command], stdout=log, stderr=subprocess.STDOUT,
                                          start_new_session=True, cwd=ROOT, env=host_env))
            # each machine in the cluster before the next is started, and all before the run, as a person would
            wait_for(lambda h=h: "Ray runtime started" in (tmp_path / f"ray-h{h}.log").read_text(), 120,
                     f"Ray on host {h}")
        yield env
    finally:
        stop(*procs)
        end_ray_processes({net.addr(h) for h in (1, 2, 3)})


def end_ray_processes(addresses: set[str]) -> None:
    """`ray start --block` stops its cluster's processes as it exits, but they run in sessions of their own and may
    outlive it: seen in CI, the next test's `ray start --head` at the same address refused ("already running") and
    that test waited out its 120 s. Wait for them, then kill those left."""

    def left() -> list[int]:
        found = subprocess.run(["pgrep", "-a", "-f", "gcs_server|raylet|ray/dashboard|log_monitor|monitor.py"],
                               capture_output=True, text=True).stdout.splitlines()
        return [int(line.split()[0]) for line in found if any(a in line for a in addresses)]

    deadline = time.monotonic() + 30
    while left() and time.monotonic() < deadline:
        time.sleep(0.5)
    for pid in left():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not left(), 30, "the Ray processes of the cluster to exit")


def finals_in(folder: Path, pattern: str) -> dict[str, dict[str, Any]]:
    return {r["node"]: r for p in folder.glob(pattern) for line in p.read_text().splitlines()
            if '"final"' in line and (r := json.loads(line))["event"] == "final"}


@pytest.mark.ray
@pytest.mark.timeout(600)
def test_the_ray_cluster_recipe_runs_as_written(net: Network, tmp_path: Path) -> None:
    # docs/ray.md's cluster of three machines and its run, the quickstart cut to two rounds; C's records come back
    # through Ray.
    pytest.importorskip("ray")
    runs = tmp_path / "runs"
    runs.mkdir()
    run_line = ray_recipe("ray-cluster")[-1]
    assert run_line[:2] == ["p2pfed", "run"]
    with ray_cluster(net, tmp_path, runs) as env:
        out = runs / "quick"
        run = subprocess.run([*net.on(1), sys.executable, "-m", *as_written(net, run_line), "--out", str(out), "-q",
                              "--set", "scenario.rounds=2", "--set", "scenario.methods=['local-p2p', 'fedavg-p2p']"],
                             capture_output=True, text=True, cwd=ROOT, timeout=480, env=env)
    assert run.returncode == 0, run.stdout + run.stderr
    for method in ("local-p2p", "fedavg-p2p"):
        said = "\n".join(p.read_text() for p in (out / method).glob("*group.log"))
        placed = set(re.findall(r"worker process \d+ on ([\d.]+)", said))
        assert placed == {net.addr(h) for h in (1, 2, 3)}, said  # one worker process on each machine
        assert said.count("is not seen here: records go to") == 1  # C's, whose records came back through Ray
        assert len(finals_in(out / method, "n*.jsonl")) == 20  # C's nodes' records too
    assert "20/20" in run.stdout


@pytest.mark.ray
@pytest.mark.timeout(600)
def test_the_ray_deploy_recipe_starts_each_node_on_the_machine_of_its_data(net: Network, tmp_path: Path) -> None:
    # docs/ray.md's `p2pfed deploy` on the same cluster, run as written from A: the own-data example's three
    # machines (node/example_data.py: a and b hold digits 0-4, c digits 5-9), each node on its data's machine.
    # pFedLIA finds that a and b help each other; C's node's records come back through Ray.
    pytest.importorskip("ray")
    runs = tmp_path / "runs"
    runs.mkdir()
    data = tmp_path / "data"
    subprocess.run([sys.executable, str(ROOT / "node" / "example_data.py"), str(data)], check=True, timeout=60)
    line = ray_recipe("ray-deploy")[0]
    assert line[:2] == ["p2pfed", "deploy"]
    command = [w.replace("/data/", f"{data}/") for w in as_written(net, line)]
    with ray_cluster(net, tmp_path, runs) as env:
        out = runs / "mesh"
        run = subprocess.run([*net.on(1), sys.executable, "-m", *command, "--out", str(out), "-q"],
                             capture_output=True, text=True, cwd=ROOT, timeout=480,
                             env={**env, "P2PFED_HOME": str(tmp_path / "home1")})
    assert run.returncode == 0, run.stdout + run.stderr
    for name, h in (("a", 1), ("b", 2), ("c", 3)):
        assert "worker process" in (out / f"{name}.log").read_text()
        assert f" on {net.addr(h)} " in (out / f"{name}.log").read_text()  # on the machine of its data
    assert "is not seen here" in (out / "c.log").read_text()
    final = finals_in(out, "*.jsonl")
    assert sorted(final["a"]["chosen"]) == ["b"] and sorted(final["b"]["chosen"]) == ["a"]
    assert "bootstrap ticket: tcp://" in run.stderr
    assert re.search(r"^a +on 10\.\S+ +accuracy \d+\.\d+ %, chose b$", run.stdout, flags=re.MULTILINE), run.stdout
