"""Ray places a scenario's worker processes (scenario.engine = "ray"): the same results as the local engine for the
same seed, nodes on two Ray nodes still talking ZeroMQ, and a worker process Ray restarts resuming its nodes from
their checkpoints. The tests that start a Ray cluster are marked `ray`; the rest need no Ray."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from p2pfed.cli import main
from p2pfed.config import ConfigError
from p2pfed.launch.deploy import Placement, parse_placement
from p2pfed.launch.member import any_port
from p2pfed.launch.ray_engine import TOKEN, NodeGroup, RayMesh, check_authenticated, require_ray, write_back
from p2pfed.scenario.config import RayConfig, load_scenario
from tests.helpers import wait_for

# Two clusters of three nodes on the bundled digits, learning fast (a logistic regression): seconds a method.
SCENARIO = """
[scenario]
name = "placed"
seed = 3
nodes = 6
rounds = 4
workers = 2
methods = ["oracle-p2p", "local-p2p"]
[data]
dataset = "digits"
max_train = 16
[data.partition]
kind = "pathological"
clusters = 2
[train]
model = "logreg"
batch_size = 16
lr = 0.05
round_timeout = 20
[mesh]
heartbeat = 0.5
"""


@pytest.fixture
def scenario_file(tmp_path: Path) -> Path:
    path = tmp_path / "placed.toml"
    path.write_text(SCENARIO)
    return path


def finals(run: Path, method: str) -> dict[str, float]:
    """Each node's final accuracy in a method's run folder."""
    out = {}
    for records in sorted((run / method).glob("n*.jsonl")):
        for line in records.read_text().splitlines():
            record = json.loads(line)
            if record["event"] == "final":
                out[record["node"]] = record["accuracy"]
    return out


def test_ray_settings_are_checked_and_named(scenario_file: Path) -> None:
    placed = load_scenario(scenario_file, ["scenario.engine=ray", "ray.address=10.0.0.5:6379", "ray.gpus=0.25"])
    assert (placed.engine, placed.ray.address, placed.ray.gpus) == ("ray", "10.0.0.5:6379", 0.25)
    # where a run is placed does not change what it is: its run folder takes the same scenario on either engine
    assert not placed.differs_from(load_scenario(scenario_file))
    for override, said in [("scenario.engine=rayy", "engine must be one of local, ray (got 'rayy')"),
                           ("ray.cpus=0", "ray.cpus must be in (0, 1024]"),
                           ("ray.placement=scatter", "ray.placement must be one of spread, pack"),
                           ("ray.restarts=-1", "ray.restarts must be in [0, 100]"),
                           ("ray.address=host;rm -rf", "ray.address must be HOST:PORT, auto, or empty"),
                           ("ray.adress=x", "ray.adress is not a known key")]:
        with pytest.raises(ConfigError, match=re.escape(said)):
            load_scenario(scenario_file, [override])
    # a scripted crash stops a worker process: on Ray that must be one node's
    events = ["scenario.engine=ray", "scenario.events=[{round = 1, action = 'crash', node = 2}]"]
    with pytest.raises(ConfigError, match="events on Ray need processes = true"):
        load_scenario(scenario_file, events)
    load_scenario(scenario_file, [*events, "scenario.processes=true"])


def test_without_ray_the_error_names_the_extra_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # an import of ray fails, as where it is not installed
    with pytest.raises(ConfigError, match=re.escape("pip install -e '.[ray]'")):
        require_ray()


def test_address_goes_with_the_ray_engine(scenario_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", str(scenario_file), "--engine", "local", "--address", "h:6379", "-q"]) == 2
    assert "--address is a Ray cluster's: it goes with --engine ray" in capsys.readouterr().err


def test_a_group_of_nodes_listens_on_the_host_asked_for_each_on_a_port_of_its_own() -> None:
    # the nodes of one process all bound loopback before, whatever --bind said: unreachable from another machine
    assert any_port("tcp://10.1.2.3:7000") == "tcp://10.1.2.3:0"
    assert any_port("tcp://0.0.0.0:0") == "tcp://0.0.0.0:0"


def test_a_worker_process_writes_to_the_run_folder_only_where_it_sees_the_drivers(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "machine"))  # this machine's temporary folder
    (tmp_path / "machine").mkdir()
    run = tmp_path / "run"
    run.mkdir()
    (run / TOKEN).write_text("abc")
    assert NodeGroup({"out": str(run), "token": "abc", "names": ["n00"]}).folder() == (run, True)
    # another machine: no such folder, or one of another run there; a folder of its own, named by the run's token
    # and its first node (a restarted actor on that machine finds its nodes' checkpoints in it), its user's only
    folder, shared = NodeGroup({"out": str(run), "token": "other", "names": ["n03", "n04"]}).folder()
    assert not shared and folder == tmp_path / "machine" / "p2pfed-ray-other" / "n03"
    assert folder.stat().st_mode & 0o777 == 0o700 and folder.parent.stat().st_mode & 0o777 == 0o700
    spec = {"out": str(tmp_path / "absent"), "token": "other", "names": ["n05"]}
    assert NodeGroup(spec).folder() == (folder.parent / "n05", False)


def test_what_a_worker_process_sends_back_is_written_by_name_only(tmp_path: Path) -> None:
    sent = {"files": {"n00.jsonl": b"{}\n", "n00-group.log": b"said", "../escape": b"x", "sub/x": b"x",
                      ".keys": b"x", "n01.jsonl": "not bytes"}, "error": None}
    assert write_back(sent, tmp_path) is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["n00-group.log", "n00.jsonl"]
    assert write_back({"files": {}, "error": "ValueError('x')"}, tmp_path) == "ValueError('x')"


def test_a_cluster_at_an_address_is_joined_only_with_ray_token_authentication(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    with pytest.raises(ConfigError, match="reached without Ray's token authentication"):
        check_authenticated(RayConfig(address="10.0.0.1:6379"))
    check_authenticated(RayConfig(address="10.0.0.1:6379", authenticated=False))  # told the network is trusted
    assert "runs without token authentication" in caplog.text
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    check_authenticated(RayConfig(address="10.0.0.1:6379"))


def test_a_cluster_head_that_is_not_there_is_said_at_once(monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    # seen: `p2pfed deployment stop x --address HOST:PORT` with no head there sat in Ray's retries, printing Ray's
    # own warnings; this test, before the mend, was cut short by its 5-minute limit with nothing said
    pytest.importorskip("ray")  # Ray's own client is what is asked here (without the extra: "Ray is needed here")
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    monkeypatch.setenv("RAY_AUTH_TOKEN", "0" * 32)
    with socket.socket() as held:  # a port of its own, bound and not listening: nothing answers there
        held.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{held.getsockname()[1]}"
        assert main(["deployment", "stop", "x", "--address", address]) == 2
    said = capsys.readouterr().err.strip().splitlines()
    assert said == [f"p2pfed: nothing answers at {address!r} (Connection refused): is the cluster's head started there "
                    "(`ray start --head`), and is its port reachable from this machine?"]


def test_a_run_on_ray_names_the_device_its_nodes_said_and_their_share_of_a_gpu() -> None:
    # seen on an H100 with ray.gpus = 0.25: every node trained on cuda:0, but the table said "Trained on: auto
    # (0.25 GPU a worker process, placed by Ray)": the driver cannot resolve "auto" where the actors run
    assert RayMesh.placed_on("cuda:0 (NVIDIA H100 80GB HBM3)", 0.25) == (
        "cuda:0 (NVIDIA H100 80GB HBM3), placed by Ray with 0.25 GPU a worker process")
    assert RayMesh.placed_on("cpu", 0) == "cpu"


def test_ray_hides_gpus_from_a_worker_process_given_none(scenario_file: Path) -> None:
    with pytest.raises(ConfigError, match="Ray hides every GPU from a worker process given none"):
        load_scenario(scenario_file, ["scenario.engine=ray", "train.device=cuda"])
    load_scenario(scenario_file, ["scenario.engine=ray", "train.device=cuda", "ray.gpus=0.5"])
    load_scenario(scenario_file, ["train.device=cuda"])  # the local engine: the machine's GPU, if it has one
    with pytest.raises(ConfigError, match=re.escape("workers (7) must be at most scenario.nodes (6)")):
        load_scenario(scenario_file, ["scenario.workers=7"])


# --- with a Ray cluster --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def two_ray_nodes() -> Iterator[Any]:
    """A Ray cluster of two Ray nodes on this machine (as `ray start --head` and `ray start --address` on two
    machines would make), one CPU each, so that two worker processes land one on each."""
    pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, connect=False,
                      head_node_args={"num_cpus": 1, "include_dashboard": False})
    cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    try:
        yield cluster
    finally:
        cluster.shutdown()


def run_cli(*args: str, cwd: Path) -> subprocess.Popen[bytes]:
    """p2pfed run; at the test's cluster (started without token authentication: the recipe test in
    tests/test_multihost.py runs one with it), told that the network is trusted."""
    trusted = ["--set", "ray.authenticated=false"] if "--address" in args else []
    return subprocess.Popen([sys.executable, "-m", "p2pfed", "run", *args, *trusted, "-q"], cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def ray_nodes_of(run: Path, method: str) -> set[str]:
    """The Ray nodes a method's worker processes said they ran on (their logs)."""
    said = "\n".join(p.read_text() for p in (run / method).glob("*group.log"))
    return set(re.findall(r"\(Ray node (\w+)\)", said))


@pytest.mark.ray
@pytest.mark.timeout(600)
def test_a_run_spread_over_two_ray_nodes_gives_the_local_engines_results(two_ray_nodes: Any, scenario_file: Path,
                                                                        tmp_path: Path) -> None:
    local = run_cli(str(scenario_file), "--out", str(tmp_path / "local"), cwd=tmp_path)
    assert local.wait(300) == 0, local.stdout.read().decode() if local.stdout else ""
    placed = run_cli(str(scenario_file), "--out", str(tmp_path / "ray"), "--address", two_ray_nodes.address,
                     cwd=tmp_path)
    said = placed.communicate(timeout=300)[0].decode()
    assert placed.returncode == 0, said
    assert "runs without token authentication" in (tmp_path / "ray" / "run.log").read_text()  # warned
    # and on a cluster of this machine alone, started for the run (with a token of its own)
    alone = run_cli(str(scenario_file), "--out", str(tmp_path / "alone"), "--engine", "ray", cwd=tmp_path)
    said = alone.communicate(timeout=300)[0].decode()
    assert alone.returncode == 0, said
    local_table = json.loads((tmp_path / "local" / "summary.json").read_text())["methods"]
    for run in ("ray", "alone"):
        for method in ("oracle-p2p", "local-p2p"):
            assert finals(tmp_path / run, method) == finals(tmp_path / "local", method)
            assert len(finals(tmp_path / run, method)) == 6
            assert not (tmp_path / run / method / TOKEN).exists()
        table = json.loads((tmp_path / run / "summary.json").read_text())["methods"]
        assert {m: t["accuracy"] for m, t in table.items()} == {m: t["accuracy"] for m, t in local_table.items()}
    for method in ("oracle-p2p", "local-p2p"):
        assert len(ray_nodes_of(tmp_path / "ray", method)) == 2  # a worker process on each Ray node


@pytest.mark.ray
@pytest.mark.timeout(600)
def test_a_killed_worker_process_is_restarted_by_ray_and_its_nodes_resume_from_their_checkpoints(
        two_ray_nodes: Any, scenario_file: Path, tmp_path: Path) -> None:
    rounds = ["--set", "scenario.rounds=40", "--methods", "local-p2p"]
    local = run_cli(str(scenario_file), "--out", str(tmp_path / "local"), *rounds, cwd=tmp_path)
    assert local.wait(300) == 0
    run = tmp_path / "ray"
    placed = run_cli(str(scenario_file), "--out", str(run), "--address", two_ray_nodes.address, *rounds,
                     cwd=tmp_path)
    group_log = run / "local-p2p" / "n00-group.log"

    def past_round_3() -> bool:
        records = run / "local-p2p" / "n00.jsonl"
        return records.exists() and any(json.loads(line).get("round", 0) >= 3
                                        for line in records.read_text().splitlines())

    wait_for(lambda: group_log.exists() and past_round_3(), 120, "n00 past round 3")
    pid = int(re.findall(r"worker process (\d+) on", group_log.read_text())[0])
    os.kill(pid, signal.SIGKILL)  # as a machine's OOM killer or a crash would
    said = placed.communicate(timeout=300)[0].decode()
    assert placed.returncode == 0, said
    log = group_log.read_text()
    pids = re.findall(r"worker process (\d+) on", log)
    assert len(pids) == 2 and pids[0] != pids[1]  # Ray started it again
    assert "n00: resumed from its checkpoint at round" in log
    # its nodes finished, and (local training is seeded by node and round) exactly as without the kill
    assert finals(run, "local-p2p") == finals(tmp_path / "local", "local-p2p")


def test_ray_is_not_imported_until_a_run_asks_for_it() -> None:
    # pip install p2pfed without the ray extra keeps working, and a local run does not pay for Ray's import
    code = "import sys, p2pfed.launch.ray_engine, p2pfed.launch.runner; print('ray' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout.strip() == "False"


def test_a_deployed_nodes_placement_is_read_from_its_data_option(tmp_path: Path) -> None:
    assert parse_placement("a=10.0.0.2:/data/a=1.npz", tmp_path) == Placement("a", "10.0.0.2", "/data/a=1.npz")
    # no name: the file's stem; a relative path: from where the command runs (the machines share a layout)
    assert parse_placement("10.0.0.3:data/b.npz", tmp_path) == Placement("b", "10.0.0.3", str(tmp_path / "data/b.npz"))
    for text, said in [("10.0.0.2", "give [NAME=]HOST:PATH"), ("a=:/p.npz", "give [NAME=]HOST:PATH"),
                       ("h:", "give [NAME=]HOST:PATH"), ("x y=h:/p.npz", "the node's name 'x y' must be")]:
        with pytest.raises(ConfigError, match=re.escape(said)):
            parse_placement(text, tmp_path)


def test_deploy_refuses_bad_options_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    recipe = Path(__file__).resolve().parents[2] / "node" / "recipe.toml"
    for args, said in [(["--data", "nohost"], "give [NAME=]HOST:PATH"),
                       (["--data", "h:/a.npz", "--cpus", "0"], "--cpus must be in (0, 1024]"),
                       (["--data", "h:/a.npz", "--port", "70000"], "--port must be in 0..65535")]:
        assert main(["deploy", str(recipe), *args, "-q"]) == 2
        assert said in capsys.readouterr().err


@pytest.mark.ray
@pytest.mark.timeout(300)
def test_deploy_names_a_machine_that_is_not_in_the_cluster(two_ray_nodes: Any, tmp_path: Path) -> None:
    recipe = Path(__file__).resolve().parents[2] / "node" / "recipe.toml"
    run = subprocess.run([sys.executable, "-m", "p2pfed", "deploy", str(recipe), "--address", two_ray_nodes.address,
                          "--data", "a=10.9.9.9:/data/a.npz", "--out", str(tmp_path / "d"), "-q",
                          "--ray-unauthenticated"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2
    assert "--data: 10.9.9.9 is no machine of the Ray cluster (its machines: " in run.stderr


def descendants(pid: int) -> set[int]:
    """The processes below pid (from /proc: the test needs no psutil)."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[-1].split()  # after the name: state, then the parent
        except OSError:  # ended meanwhile
            continue
        if len(fields) > 1:
            parents[int(stat.parent.name)] = int(fields[1])
    found, todo = set(), [pid]
    while todo:
        current = todo.pop()
        children = [p for p, parent in parents.items() if parent == current]
        found.update(children)
        todo.extend(children)
    return found


def long_ray_run(scenario_file: Path, run: Path) -> tuple[subprocess.Popen[str], Path, set[int]]:
    """A run of 400 rounds on a Ray cluster of this machine started for it, past its round 2: the process, its first
    node's records file, and the processes it started (Ray's and its actors)."""
    proc = subprocess.Popen([sys.executable, "-m", "p2pfed", "run", str(scenario_file), "--out", str(run), "-q",
                             "--engine", "ray", "--set", "scenario.rounds=400"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    records = run / "oracle-p2p" / "n00.jsonl"
    wait_for(lambda: records.exists() and '"round": 2' in records.read_text(), 180, "round 2")
    return proc, records, descendants(proc.pid)


@pytest.mark.ray
@pytest.mark.timeout(300)
def test_sigterm_stops_a_run_on_ray_and_the_cluster_it_started(scenario_file: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    proc, records, below = long_ray_run(scenario_file, run)
    assert below  # Ray's processes and its actors, started by the run
    proc.send_signal(signal.SIGTERM)  # a service manager's stop, `kill`
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130 and "interrupted; partial run folder" in err, err
    assert not (run / "oracle-p2p" / TOKEN).exists() and "final" not in records.read_text()  # cut short
    wait_for(lambda: not any(Path(f"/proc/{p}").exists() for p in below), 30, "Ray's processes to end")


@pytest.mark.ray
@pytest.mark.timeout(400)
def test_a_run_on_ray_killed_by_sigkill_leaves_no_process_behind(scenario_file: Path, tmp_path: Path) -> None:
    # SIGKILL gives the driver no word: Ray's own processes die with it (the kernel's parent-death signal), its
    # actors soon after, and its two agents once they find their raylet gone (63 s, measured)
    proc, _, below = long_ray_run(scenario_file, tmp_path / "run")
    assert len(below) >= 4  # Ray's control store, raylet and agents, and the two worker processes
    proc.kill()
    proc.wait(30)
    wait_for(lambda: not any(Path(f"/proc/{p}").exists() for p in below), 180, "every process the run started to end")


@pytest.mark.ray
@pytest.mark.timeout(300)
def test_sigterm_stops_a_deployment_and_names_each_node_cut_short(tmp_path: Path) -> None:
    # the own-data example's three nodes on a cluster of this machine (localhost), stopped mid-run
    root = Path(__file__).resolve().parents[2]
    data = tmp_path / "data"
    subprocess.run([sys.executable, str(root / "node" / "example_data.py"), str(data)], check=True, timeout=60)
    out = tmp_path / "mesh"
    proc = subprocess.Popen([sys.executable, "-m", "p2pfed", "deploy", str(root / "node" / "recipe.toml"), "-q",
                             "--out", str(out), *[f"--data={m}=localhost:{data}/{m}.npz" for m in "abc"]],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "P2PFED_HOME": str(tmp_path / "home")})
    records = out / "a.jsonl"
    wait_for(lambda: records.exists() and '"round": 1' in records.read_text(), 240, "node a's round 1")
    below = descendants(proc.pid)
    proc.send_signal(signal.SIGTERM)
    said, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err
    for m in "abc":  # each node named, none lost without a word
        assert f"p2pfed: {m} did not finish: stopped before the end (Ctrl-C)" in err
        assert re.search(rf"^{m} +on \S+ +stopped before the end", said, flags=re.MULTILINE), said
    assert "bootstrap ticket: tcp://127.0.0.1:" in err  # a cluster of this machine alone: loopback
    assert not (out / TOKEN).exists()
    wait_for(lambda: not any(Path(f"/proc/{p}").exists() for p in below), 30, "Ray's processes to end")
