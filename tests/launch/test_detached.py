"""A detached deployment (p2pfed deploy --detach): the nodes outlive the command, a node whose process dies is
begun again by the supervisor and resumes from its checkpoint, `p2pfed deployment status` shows where each stands,
and `p2pfed deployment stop` ends it, naming the nodes it cut short. The tests that start a Ray cluster are marked
`ray`; the rest need no Ray."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from p2pfed.cli import main
from p2pfed.launch.ray_engine import TOKEN
from tests.helpers import wait_for

ROOT = Path(__file__).resolve().parents[2]


def test_detach_needs_a_cluster_that_outlives_the_command(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    recipe = str(ROOT / "node" / "recipe.toml")
    assert main(["deploy", recipe, "--data", "a=localhost:/a.npz", "--detach", "-q"]) == 2
    assert "--detach leaves the nodes on a Ray cluster that outlives this command: give its --address" in \
        capsys.readouterr().err
    assert main(["deploy", recipe, "--data", "a=localhost:/a.npz", "--name", "m", "-q"]) == 2
    assert "--name names a detached deployment: give --detach too" in capsys.readouterr().err
    assert main(["deploy", recipe, "--data", "a=localhost:/a.npz", "--address", "h:1", "--ray-unauthenticated",
                 "--detach", "--name", "a/b", "-q"]) == 2
    assert "a deployment's name is up to 64 letters" in capsys.readouterr().err
    assert main(["deployment", "status"]) == 2
    assert "give its --address (HEAD:6379) or set RAY_ADDRESS" in capsys.readouterr().err


def test_deployments_are_told_apart_from_their_nodes_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    from p2pfed.launch import detached

    named = ["digits/supervisor", "digits/node/a", "digits/node/supervisor", "orphan/node/b", "other/thing"]
    monkeypatch.setattr(detached, "_named", lambda: named)
    # a node named "supervisor" is no deployment; one whose supervisor is gone is found by its nodes
    assert detached.deployments() == ["digits", "orphan"]
    assert detached.node_name("digits", "a") in named and detached.supervisor_name("digits") in named


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A Ray cluster of this machine that outlives each command, as `ray start --head` makes; its processes keep
    their key pairs in a home of the test's (P2PFED_HOME, which they inherit)."""
    pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    home = tmp_path_factory.mktemp("home")
    before = os.environ.get("P2PFED_HOME")
    os.environ["P2PFED_HOME"] = str(home)
    try:
        made = Cluster(initialize_head=True, connect=False,
                       head_node_args={"num_cpus": 4, "include_dashboard": False})
        made.wait_for_nodes()
    finally:
        if before is None:
            os.environ.pop("P2PFED_HOME")
        else:
            os.environ["P2PFED_HOME"] = before
    try:
        yield SimpleNamespace(address=made.address, home=home)
    finally:
        made.shutdown()


def p2pfed(cluster: Any, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    """A p2pfed command at the test's cluster (started without token authentication: tests/test_multihost.py runs
    one with it)."""
    return subprocess.run([sys.executable, "-m", "p2pfed", *args, "--address", cluster.address,
                           "--ray-unauthenticated"], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "P2PFED_HOME": str(cluster.home)})


def deploy(cluster: Any, tmp_path: Path, name: str, rounds: int) -> tuple[subprocess.CompletedProcess[str], Path]:
    """Deploy the own-data example's three nodes (a, b, c) on this machine, detached, the recipe cut to rounds."""
    data = tmp_path / "data"
    if not data.exists():
        subprocess.run([sys.executable, str(ROOT / "node" / "example_data.py"), str(data)], check=True, timeout=60)
    recipe = tmp_path / f"{name}.toml"
    recipe.write_text((ROOT / "node" / "recipe.toml").read_text().replace("rounds = 20", f"rounds = {rounds}"))
    out = tmp_path / name
    done = p2pfed(cluster, "deploy", str(recipe), "--detach", "--name", name, "--out", str(out), "-q",
                  *[f"--data={m}=localhost:{data}/{m}.npz" for m in "abc"])
    return done, out


@pytest.mark.ray
@pytest.mark.timeout(600)
def test_a_detached_deployment_outlives_its_command_survives_a_killed_node_and_is_stopped_by_name(
        cluster: Any, tmp_path: Path) -> None:
    done, out = deploy(cluster, tmp_path, "m1", rounds=8)
    assert done.returncode == 0, done.stderr
    assert "deployment m1: 3 nodes running on the Ray cluster, detached from this command" in done.stdout
    assert f"stop it: p2pfed deployment stop m1 --address {cluster.address}" in done.stdout
    token = (out / TOKEN).read_text()
    again, _ = deploy(cluster, tmp_path, "m1", rounds=8)  # the name is the deployment's, its folder left alone
    assert again.returncode == 2 and "a deployment named m1 runs on this Ray cluster already" in again.stderr
    assert (out / TOKEN).read_text() == token

    # the command has ended; the nodes learn on. One's process is killed: Ray restarts it, the supervisor begins
    # the node again, and it resumes from its checkpoint
    records, log = out / "a.jsonl", out / "a.log"
    wait_for(lambda: records.exists() and '"round": 2' in records.read_text(), 240, "node a's round 2")
    pid = int(re.findall(r"worker process (\d+) ", log.read_text())[-1])
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: "resumed from its checkpoint" in log.read_text(), 120, "node a to resume")

    listed = p2pfed(cluster, "deployment", "status")
    assert listed.returncode == 0 and listed.stdout.split() == ["m1"], listed.stderr
    status = p2pfed(cluster, "deployment", "status", "m1")
    assert status.returncode == 0, status.stderr
    assert "deployment m1: pfedlia-p2p on 3 nodes, 8 rounds; bootstrap tcp://127.0.0.1:" in status.stdout
    for m in "abc":
        assert re.search(rf"^{m} +localhost +\S+ +\S+ +(running|finished)", status.stdout, re.MULTILINE), \
            status.stdout

    wait_for(lambda: all('"final"' in (out / f"{m}.jsonl").read_text() for m in "abc"), 300, "every node's end")
    status = p2pfed(cluster, "deployment", "status", "m1")
    for m in "abc":
        assert re.search(rf"^{m} +localhost +8 +\S+ +finished: accuracy \d", status.stdout, re.MULTILINE), \
            status.stdout
    stopped = p2pfed(cluster, "deployment", "stop", "m1")
    assert stopped.returncode == 0, stopped.stderr
    for m in "abc":
        assert re.search(rf"^{m} +on localhost +accuracy \d+\.\d\d %, chose", stopped.stdout, re.MULTILINE), \
            stopped.stdout
    assert not (out / TOKEN).exists()
    assert "began again (its process was restarted)" in (out / "supervisor.log").read_text()
    assert "no deployments on this Ray cluster" in p2pfed(cluster, "deployment", "status").stdout
    gone = p2pfed(cluster, "deployment", "stop", "m1")
    assert gone.returncode == 2 and "no deployment named m1 on this Ray cluster (it has none)" in gone.stderr


@pytest.mark.ray
@pytest.mark.timeout(600)
def test_a_deployment_whose_supervisor_is_gone_is_still_stopped_mid_run_naming_each_node_cut_short(
        cluster: Any, tmp_path: Path) -> None:
    # rounds enough for no node to finish before the stop: node c chooses no peer (its influence scores are all
    # negative) and trains alone at about 20 ms a round, so 400 rounds ended before the stop where no coverage
    # slowed it
    done, out = deploy(cluster, tmp_path, "m2", rounds=100_000)
    assert done.returncode == 0, done.stderr
    wait_for(lambda: (out / "b.jsonl").exists() and '"round": 1' in (out / "b.jsonl").read_text(), 240,
             "node b's round 1")
    kill = (f"import ray; ray.init(address={cluster.address!r}, logging_level='ERROR'); "
            "ray.kill(ray.get_actor('m2/supervisor', namespace='p2pfed'), no_restart=True)")
    subprocess.run([sys.executable, "-c", kill], check=True, timeout=120, capture_output=True)
    listed = p2pfed(cluster, "deployment", "status")
    assert listed.stdout.split() == ["m2"], listed.stderr  # found by its nodes
    status = p2pfed(cluster, "deployment", "status", "m2")
    assert status.returncode == 0 and "has no supervisor that answers" in status.stderr, status.stderr
    assert re.search(r"^a +localhost +- +- +running", status.stdout, re.MULTILINE), status.stdout
    assert "deployment m2: 3 nodes (no supervisor answers: method, rounds and bootstrap unknown)" in status.stdout
    stopped = p2pfed(cluster, "deployment", "stop", "m2")
    assert stopped.returncode == 1, stopped.stderr
    for m in "abc":  # each node named, none lost without a word, each left the mesh (its final record: none)
        assert f"p2pfed: {m} did not finish: stopped before the end (p2pfed deployment stop)" in stopped.stderr, \
            stopped.stderr
        assert '"final"' not in (out / f"{m}.jsonl").read_text()
    assert "no deployments on this Ray cluster" in p2pfed(cluster, "deployment", "status").stdout
