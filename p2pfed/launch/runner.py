"""Run a scenario on this machine: for each method, a bootstrap and N nodes over real ZeroMQ TCP (all in
this process, or one process per node), a coordinator for the coordinated methods (in this process,
talking to the nodes over the same sockets), scripted events, and a run folder that p2pfed report
(report/results.py) reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from p2pfed.config import MeshConfig
from p2pfed.coordinator.server import Coordinator
from p2pfed.launch.adversary import conduct_of
from p2pfed.launch.failures import NEVER_JOINED, NOT_FINISHED, failure_reason, last_words, unfinished
from p2pfed.learn.datasets import Dataset, load_dataset, mapped, share
from p2pfed.learn.held import server_data
from p2pfed.learn.partition import Partition, server_samples, without
from p2pfed.learn.train import describe_device, pick_device, round_seed
from p2pfed.learn.transforms import apply as apply_transform
from p2pfed.methods import introduce_up_to, introduce_warning, is_central, load_checked
from p2pfed.methods.former import FORMER
from p2pfed.net import security
from p2pfed.net.endpoint import Endpoint, MeshOptions
from p2pfed.net.membership import ALIVE
from p2pfed.net.transport import allow_open_files
from p2pfed.node.client import CentralNode
from p2pfed.node.conduct import Conduct
from p2pfed.node.learner import LearningNode
from p2pfed.node.local import LocalData, NodeData
from p2pfed.report.records import read_records
from p2pfed.scenario.config import Scenario, apply_overrides, load_scenario, write_scenario

log = logging.getLogger(__name__)

Progress = Callable[[str, int, int], None]  # (method, rounds done by every node, total rounds)


def mesh_options(scenario: Scenario, method: str) -> MeshOptions:
    """Mesh timing from the scenario; each method gets its own mesh name so runs never mix."""
    return mesh_config(scenario, method).endpoint_options()[0]


def mesh_config(scenario: Scenario, method: str) -> MeshConfig:
    """The scenario's mesh settings for a method's run: its own mesh name, and introduce_up_to as the method
    takes it (methods.introduce_up_to)."""
    return dataclasses.replace(scenario.mesh_for(method), introduce_up_to=introduce_up_to(method, scenario))


def member(scenario: Scenario, method: str, name: str, out: Path, role: str = "node", recipe: str = "") -> Endpoint:
    """An endpoint (not started) of the scenario's mesh for this method, with its timing and message cap, the
    recipe it advertises (none for a bootstrap), and its key pair from the run folder (a restarted node is
    still itself), unless the scenario's mesh is insecure."""
    options, transport = mesh_config(scenario, method).endpoint_options()
    keys = None if options.insecure else security.member_keys(keys_folder(out), name)
    return Endpoint(name, role, options=options, keys=keys, transport_options=transport, recipe=recipe)


def keys_folder(out: Path) -> Path:
    """Where a run's members keep their key pairs: a hidden folder of the method's run folder, so that sharing
    a run's results (summary.json, the records) shares no secret."""
    return out / ".keys"


def capped(scenario: Scenario, train: np.ndarray, val: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A node's training and validation indices, the first data.max_train and data.max_val of them when set
    (scarce-data runs): a scenario's shard and a node's own data alike."""
    return (train[: scenario.data.max_train] if scenario.data.max_train else train,
            val[: scenario.data.max_val] if scenario.data.max_val else val)


def local_data(scenario: Scenario, index: int, dataset: Dataset, partition: Partition) -> LocalData:
    """Node index's shard (training and validation samples capped at data.max_train and data.max_val when
    set), its inputs seen through the shard's transform (feature-space clusters; the noise of each split seeded
    by the scenario and the node)."""
    shard = partition.shards[index]
    train, val = capped(scenario, shard.train, shard.val)

    def inputs(x: torch.Tensor, split: int) -> torch.Tensor:
        if shard.transform == "none":
            return x
        # a seed of its own (round_seed(seed, index, r) seeds the node's training in round r)
        return apply_transform(shard.transform, x, round_seed(scenario.seed, index, -1 - split))

    return LocalData(inputs(dataset.x_train[train], 0), dataset.y_train[train], inputs(dataset.x_train[val], 1),
                     dataset.y_train[val], inputs(dataset.x_test[shard.test], 2), dataset.y_test[shard.test])


def scenario_node(scenario: Scenario, index: int, dataset: Dataset, partition: Partition) -> NodeData:
    """What node index of a scenario learns from: its shard of the scenario's dataset, and every node's true
    cluster (to report)."""
    return NodeData(scenario.node_name(index), index, local_data(scenario, index, dataset, partition), dataset,
                    {scenario.node_name(i): int(c) for i, c in enumerate(partition.true_cluster)})


def make_node(scenario: Scenario, given: NodeData, method: str | None, endpoint: Endpoint, out: Path, *,
              coordinator: str | None = None, conduct: Conduct | None = None) -> LearningNode | CentralNode:
    """The node that runs method on what it was given: under a coordinator (a coordinated method, or none yet:
    the coordinator tells it), else peer to peer; conduct: a scripted adversary's (launch/adversary.py)."""
    if method is None or is_central(method):
        return CentralNode(scenario, given, method, endpoint, out, coordinator=coordinator, conduct=conduct)
    return LearningNode(scenario, given, method, endpoint, out, conduct=conduct)


def recipe_of(scenario: Scenario, method: str | None, dataset: Dataset) -> str:
    """The fingerprint a member training method on dataset's kind of data advertises ("" when the method is
    not known yet: a node taking it from its coordinator)."""
    if not method:
        return ""
    return scenario.fingerprint(method, dataset.input_shape, dataset.num_classes, dataset.task.name,
                                dataset.vocabulary)


# The folder of the dataset the runner wrote for its node processes to map (learn/datasets.py: share), named to
# them in their environment.
SHARED_DATA = "P2PFED_SHARED_DATA"


def prepare_data(scenario: Scenario, share_to: Path | None = None) -> tuple[Dataset, Partition]:
    """The dataset and the partition every node derives from the scenario (dealing out the samples' labels,
    or their groups, such as a word's language). share_to: a folder to write the dataset to, memory-mapped from
    there; a worker process the runner started maps the one its environment names (SHARED_DATA) instead of
    loading its own."""
    d = scenario.data
    key = json.dumps([d.dataset, d.root, scenario.seed, d.words_per_sample])  # what load_dataset is given
    given = os.environ.get(SHARED_DATA)
    dataset = mapped(Path(given), key) if given and share_to is None else None
    if dataset is None:
        dataset = load_dataset(d.dataset, d.root or None, scenario.seed, d.words_per_sample)
        if share_to is not None:
            dataset = share(dataset, share_to, key)
    y_train, y_test = dataset.keys()
    if scenario.data.server_per_class:  # the server's samples first, the rest dealt to the nodes
        y_train = without(y_train, server_samples(y_train, scenario.data.server_per_class, scenario.seed))
    partition = scenario.data.partition.build(y_train, y_test, scenario.nodes, scenario.seed,
                                              scenario.data.val_fraction)
    return dataset, partition


def make_coordinator(scenario: Scenario, method: str, endpoint: Endpoint, dataset: Dataset, partition: Partition,
                     out: Path, state_dir: Path | None = None) -> Coordinator:
    """The coordinator of a scenario's coordinated method, handed what it holds of the data (the samples set aside
    for its method's server, its test set) and the nodes' true clusters: it knows no dataset or partition."""
    data = server_data(dataset, scenario.seed, scenario.data.server_per_class, scenario.data.server_test)
    truth = {scenario.node_name(i): int(c) for i, c in enumerate(partition.true_cluster)}
    return Coordinator(scenario, method, endpoint, data, truth, out, state_dir)


@dataclass
class MethodRun:
    """What the runner saw of one method's run."""

    method: str
    seconds: float = 0.0
    device: str = ""  # what the nodes trained on, as they said (before they say: train.device resolved here)
    members: int = 0  # how many were to finish (launch/failures.py)
    # member -> why it crashed, never joined the mesh or did not finish
    crashed: dict[str, str] = field(default_factory=dict)
    events: list[str] = field(default_factory=list)


class InProcessMesh:
    """All nodes of one method as asyncio tasks of this process, each with its own sockets."""

    def __init__(self, scenario: Scenario, method: str, dataset: Dataset, partition: Partition, out: Path) -> None:
        self.scenario, self.method, self.dataset, self.partition, self.out = scenario, method, dataset, partition, out
        self.options = mesh_options(scenario, method)
        self.boot: Endpoint | None = None
        self.nodes: dict[int, LearningNode | CentralNode] = {}
        self.tasks: dict[int, asyncio.Task[None]] = {}
        self.run = MethodRun(method)
        self.starting: str | None = None  # the member being started: a start that fails names it
        self.host = "127.0.0.1"  # where the bootstrap and a coordinator listen (Ray: where its actors reach them)

    def device(self) -> str:
        """What the nodes train on, as this machine can tell before they say (run.json of a run cut short)."""
        return device_of(self.scenario)

    def placed(self, devices: str) -> str:
        """run.json's device, from the devices the nodes said they trained on (Ray adds their share of a GPU)."""
        return devices

    def present(self) -> list[str]:
        """The members that are to finish: those started and not stopped by a scripted leave or crash."""
        return [self.scenario.node_name(i) for i in self.tasks]

    def why(self, name: str) -> str | None:
        """What is known of why a member did not finish (its crash)."""
        return self.run.crashed.get(name)

    def joined(self) -> set[str]:
        """The members that joined the mesh (a node here is kept once its join was welcomed)."""
        return {n.name for n in self.nodes.values()}

    async def start(self) -> None:
        self.boot = member(self.scenario, self.method, "bootstrap", self.out, "bootstrap")
        await self.boot.start(f"tcp://{self.host}:0")

    def entry(self, via: int = -1) -> str:
        """The ticket a joiner joins through: node via's if it runs, else the bootstrap's."""
        assert self.boot is not None
        node = self.nodes.get(via)
        return node.endpoint.ticket if node is not None and not self.tasks[via].done() else self.boot.ticket

    async def start_node(self, index: int, start_round: int = 0, wait_for: int = 0, via: int = -1) -> None:
        name = self.starting = self.scenario.node_name(index)
        endpoint = member(self.scenario, self.method, name, self.out,
                          recipe=recipe_of(self.scenario, self.method, self.dataset))
        try:
            await endpoint.start("tcp://127.0.0.1:0", [self.entry(via)])
            await endpoint.wait_joined(30)
            node = make_node(self.scenario, scenario_node(self.scenario, index, self.dataset, self.partition),
                             self.method, endpoint, self.out, conduct=conduct_of(self.scenario, index))
        except BaseException:
            await endpoint.stop(leave=False)  # its sockets and tasks, not left behind for the next method
            raise
        self.nodes[index] = node
        self.tasks[index] = asyncio.get_running_loop().create_task(
            self._run_node(node, start_round, wait_for), name=name)

    async def _run_node(self, node: LearningNode | CentralNode, start_round: int, wait_for: int) -> None:
        try:
            await node.run(start_round, wait_for_peers=wait_for)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.run.crashed[node.name] = repr(exc)
            log.exception("%s crashed", node.name)
        finally:
            await node.endpoint.stop(leave=True)

    async def stop_node(self, index: int, crash: bool) -> None:
        task, node = self.tasks.pop(index, None), self.nodes.pop(index, None)
        if task is None or node is None:
            return
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
        await node.endpoint.stop(leave=not crash)

    def rounds(self) -> dict[int, int]:
        return {i: n.round for i, n in self.nodes.items()}

    def running(self) -> bool:
        return any(not t.done() for t in self.tasks.values())

    def set_delay(self, index: int, delay: float) -> None:
        if index in self.nodes:
            self.nodes[index].send_delay = delay

    async def close(self) -> None:
        for index in list(self.tasks):
            await self.stop_node(index, crash=False)
        if self.boot is not None:
            await self.boot.stop()


class ProcessMesh(InProcessMesh):
    """Nodes in child processes (`p2pfed node --scenario ...`), one per node as on separate machines, or a
    few nodes per process; the bootstrap here. Progress comes from the rounds nodes report in heartbeats."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.procs: dict[int, subprocess.Popen[bytes]] = {}  # node index -> its process
        self.logs: dict[int, Path] = {}  # node index -> its process's log
        self.delays: dict[int, float] = {}

    def entry(self, via: int = -1) -> str:
        """The ticket a joiner joins through: node via's (its address and key as the bootstrap knows them) if it
        is alive, else the bootstrap's."""
        assert self.boot is not None
        peer = self.boot.peers.peers.get(self.scenario.node_name(via)) if via >= 0 else None
        if peer is None or peer.state != ALIVE:
            return self.boot.ticket
        return security.ticket(peer.address, peer.pubkey.encode() if peer.pubkey else None)

    async def start_node(self, index: int, start_round: int = 0, wait_for: int = 0, via: int = -1) -> None:
        await self.start_group([index], start_round, wait_for, via)

    async def start_group(self, indices: list[int], start_round: int = 0, wait_for: int = 0, via: int = -1) -> None:
        first = self.starting = self.scenario.node_name(indices[0])
        log_path = self.out / (f"{first}.log" if len(indices) == 1 else f"{first}-group.log")
        cmd = [sys.executable, "-m", "p2pfed", "node", "--join", self.entry(via), "--bind", "tcp://127.0.0.1:0",
               "--scenario", str(Path(self.scenario.path).resolve()), "--index", ",".join(map(str, indices)),
               "--method", self.method, "--out", str(self.out), "--start-round", str(start_round),
               "--wait-for", str(wait_for), "--mesh", self.options.mesh,
               *(["--insecure"] if self.options.insecure else ["--keys", str(keys_folder(self.out))])]
        delay = max(self.delays.get(i, 0.0) for i in indices)
        if delay:
            cmd += ["--send-delay", str(delay)]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        if self.dataset.mapped_from is not None:  # the children map the runner's copy of the dataset
            env[SHARED_DATA] = str(self.dataset.mapped_from)
        with open(log_path, "ab") as logf:
            proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        for i in indices:
            self.procs[i] = proc
            self.logs[i] = log_path

    def indices(self) -> list[int]:
        """The nodes started and not stopped: each has a worker process."""
        return list(self.procs)

    def present(self) -> list[str]:
        return [self.scenario.node_name(i) for i in self.indices()]

    def joined(self) -> set[str]:
        """The children's nodes the bootstrap welcomed (it keeps them in its table, alive or not)."""
        return set(self.boot.peers.peers) if self.boot is not None else set()

    def why(self, name: str) -> str | None:
        """A child's crash as the runner saw it, with what the child said last (its log)."""
        index = next((i for i, p in self.logs.items() if self.scenario.node_name(i) == name), None)
        said = last_words(self.logs.get(index)) if index is not None else None
        seen = self.run.crashed.get(name)
        return f"{said} ({seen})" if said and seen else said or seen

    async def stop_node(self, index: int, crash: bool) -> None:
        proc = self.procs.pop(index, None)
        if proc is None or proc.poll() is not None:
            return
        for other in [i for i, p in self.procs.items() if p is proc]:
            del self.procs[other]
        os.killpg(proc.pid, signal.SIGKILL if crash else signal.SIGTERM)
        try:
            await asyncio.to_thread(proc.wait, 30)
        except subprocess.TimeoutExpired:
            log.warning("node process %d did not stop within 30 s of SIGTERM; killing it", proc.pid)
            os.killpg(proc.pid, signal.SIGKILL)
            await asyncio.to_thread(proc.wait, 10)

    def rounds(self) -> dict[int, int]:
        assert self.boot is not None
        table = self.boot.peers.peers
        return {i: table[self.scenario.node_name(i)].round for i in self.indices()
                if self.scenario.node_name(i) in table}

    def running(self) -> bool:
        for index, proc in self.procs.items():
            code = proc.poll()
            name = self.scenario.node_name(index)
            if code not in (None, 0) and name not in self.run.crashed:
                self.run.crashed[name] = f"exit code {code} (see the logs in {self.out})"
        return any(p.poll() is None for p in self.procs.values())

    def set_delay(self, index: int, delay: float) -> None:
        self.delays[index] = delay
        log.warning("slow link for %s applies from its next start in process mode",
                    self.scenario.node_name(index))

    async def close(self) -> None:
        # Ask every child to stop at once, then wait for them together (not one stop after the other).
        await asyncio.gather(*(self.stop_node(i, crash=False) for i in list(self.procs)))
        if self.boot is not None:
            await self.boot.stop()


class Script:
    """The scenario's scripted events (joins, leaves, crashes and their restarts, slow links), applied to a
    mesh as the round front passes them."""

    def __init__(self, scenario: Scenario, mesh: InProcessMesh) -> None:
        self.scenario, self.mesh = scenario, mesh
        self.pending = sorted(scenario.events, key=lambda e: e.round)
        self.restarts: list[tuple[int, int]] = []  # (round, node)

    @property
    def done(self) -> bool:
        return not self.pending and not self.restarts

    async def advance(self, front: int) -> None:
        """Apply every event due at or before round front."""
        mesh, method = self.mesh, self.mesh.method
        while self.pending and self.pending[0].round <= front:
            ev = self.pending.pop(0)
            name = self.scenario.node_name(ev.node)
            mesh.run.events.append(f"round {ev.round}: {ev.action} {name} (mesh at round {front})")
            log.info("%s: event at round %d: %s %s", method, front, ev.action, name)
            if ev.action == "join":
                await self._start(ev.node, ev.round, NEVER_JOINED, ev.via)
            elif ev.action in ("leave", "crash"):
                await mesh.stop_node(ev.node, crash=ev.action == "crash")
                if ev.action == "crash" and ev.restart_after:
                    self.restarts.append((ev.round + ev.restart_after, ev.node))
            elif ev.action == "slow":
                mesh.set_delay(ev.node, ev.delay)
        for item in [r for r in self.restarts if r[0] <= front]:
            self.restarts.remove(item)
            name = self.scenario.node_name(item[1])
            mesh.run.events.append(f"round {item[0]}: restart {name} (mesh at round {front})")
            await self._start(item[1], item[0], f"{NOT_FINISHED} (its restart failed)")

    async def _start(self, index: int, start_round: int, what: str, via: int = -1) -> None:
        """A scripted join or restart; one that fails is told (run.json, the run's line) and the run goes on."""
        try:
            await self.mesh.start_node(index, start_round=start_round, via=via)
        except Exception as exc:
            name = self.scenario.node_name(index)
            log.info("%s: %s could not start", self.mesh.method, name, exc_info=exc)  # the terminal has its line
            why = failure_reason(exc, len(self.mesh.present()), self.scenario.nodes)
            self.mesh.run.crashed[name] = f"{what}: {why}"


async def _start_coordinator(mesh: InProcessMesh, wait_for: int) -> tuple[Coordinator, asyncio.Task[None]]:
    """A coordinated method's coordinator, joined to the mesh and running."""
    assert mesh.boot is not None
    mesh.starting = "coordinator"
    endpoint = member(mesh.scenario, mesh.method, "coordinator", mesh.out, "coordinator",
                      recipe_of(mesh.scenario, mesh.method, mesh.dataset))
    try:
        await endpoint.start(f"tcp://{mesh.host}:0", [mesh.boot.ticket])
        await endpoint.wait_joined(30)
        coordinator = make_coordinator(mesh.scenario, mesh.method, endpoint, mesh.dataset, mesh.partition, mesh.out)
    except BaseException:
        await endpoint.stop(leave=False)  # not left behind for the next method
        raise
    task = asyncio.get_running_loop().create_task(coordinator.run(wait_for=wait_for), name="coordinator")
    return coordinator, task


async def _start_nodes(mesh: InProcessMesh, initial: list[int]) -> None:
    """The nodes present from the first round: in this process, one process each, or in worker groups."""
    if isinstance(mesh, ProcessMesh) and not mesh.scenario.processes:
        for group in np.array_split(np.array(initial), mesh.scenario.workers):
            await mesh.start_group([int(i) for i in group], wait_for=len(initial) - 1)
    else:
        for i in initial:
            await mesh.start_node(i, wait_for=len(initial) - 1)


async def _coordinated_progress(mesh: InProcessMesh, coordinator: Coordinator, task: asyncio.Task[None]
                                ) -> int | None:
    """Rounds done by a coordinated run (the coordinator's round; all of them once it ended), None if the
    coordinator crashed. A coordinator that ended leaves the mesh, so a node that missed its finish ends too."""
    if not task.done():
        return coordinator.round
    if not task.cancelled() and task.exception() is not None:
        exc = task.exception()
        mesh.run.crashed["coordinator"] = repr(exc)
        log.error("%s: the coordinator crashed", mesh.method, exc_info=exc)
        return None
    if not coordinator.endpoint.stopped:
        await coordinator.endpoint.stop()
    return mesh.scenario.rounds


async def run_method(scenario: Scenario, method: str, dataset: Dataset, partition: Partition, out: Path,
                     progress: Progress | None = None) -> MethodRun:
    """Run one method on the scenario's mesh, its scripted events included; return what happened."""
    out.mkdir(parents=True, exist_ok=True)
    # run.json too: it marks a method that ran to its end (a run over seeds skips those when it resumes); and
    # the compressed records of a shipped folder run again
    for stale in [*out.glob("*.jsonl"), *out.glob("*.jsonl.gz"), *out.glob("*.safetensors"), *out.glob("*.ckpt"),
                  *out.glob("*.kept"), *out.glob("run.json")]:
        stale.unlink()
    if cut_short := introduce_warning(method, scenario):
        log.warning("%s", cut_short)
    in_children = scenario.processes or scenario.workers > 1
    kind: type[InProcessMesh] = ProcessMesh if in_children else InProcessMesh
    if scenario.engine == "ray":  # worker processes placed by Ray (an optional extra: imported only here)
        from p2pfed.launch.ray_engine import RayMesh
        kind = RayMesh
    mesh = kind(scenario, method, dataset, partition, out)
    mesh.run.device = mesh.device()
    t0 = time.monotonic()
    late = {ev.node for ev in scenario.events if ev.action == "join"}
    initial = [i for i in range(scenario.nodes) if i not in late]
    script = Script(scenario, mesh)
    coordinator: Coordinator | None = None
    coordinator_task: asyncio.Task[None] | None = None
    present: list[str] = []  # the members that were to finish, once known
    failed = False
    try:
        await mesh.start()
        try:
            if is_central(method):
                coordinator, coordinator_task = await _start_coordinator(mesh, wait_for=len(initial))
            await _start_nodes(mesh, initial)
        except Exception as exc:  # a member that could not start ends the method: its reason in one line
            # (the traceback in run.log); the nodes it started are stopped and counted as not finished
            log.info("%s: %s could not start", method, mesh.starting, exc_info=exc)  # the terminal has its line
            mesh.run.crashed[mesh.starting or "runner"] = failure_reason(exc, len(mesh.present()), len(initial))
            present = [n for n in [mesh.starting, *mesh.present()] if n]
            failed = True
        while not failed:
            await asyncio.sleep(0.2)
            rounds = mesh.rounds()
            front, done = max(rounds.values(), default=0), min(rounds.values(), default=0)
            if coordinator is not None and coordinator_task is not None:
                front = coordinator.round
                coordinated = await _coordinated_progress(mesh, coordinator, coordinator_task)
                if coordinated is None:
                    break
                done = coordinated
            if progress:
                progress(method, done, scenario.rounds)
            await script.advance(front)
            if not mesh.running() and script.done:
                if coordinator is not None and coordinator_task is not None:  # the nodes end once they have
                    # their final model; the coordinator may still be writing its last records (a server-held
                    # test, the final record): it ends, or its crash is told, before the run does
                    await asyncio.wait({coordinator_task}, timeout=2 * scenario.train.round_timeout)
                    await _coordinated_progress(mesh, coordinator, coordinator_task)
                elif progress and not mesh.run.crashed:  # a node's round is the last it began: it ended them all
                    progress(method, scenario.rounds, scenario.rounds)
                break
        present = present if failed else mesh.present()
    finally:
        joined = mesh.joined()  # before the mesh closes: the bootstrap's table goes with it
        if coordinator_task is not None and not coordinator_task.done():
            coordinator_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await coordinator_task
        if coordinator is not None:
            await coordinator.endpoint.stop()
        await mesh.close()
    mesh.run.seconds = time.monotonic() - t0
    mesh.run.members = max(len(present), len(initial)) if failed else len(present)
    mesh.run.crashed.update(unfinished(out, present, joined, mesh.why))
    said = devices_said(out)  # where the nodes ran, what they trained on is their word, not this machine's guess
    if said is not None:
        mesh.run.device = mesh.placed(said)
    (out / "run.json").write_text(json.dumps(mesh.run.__dict__, indent=2))
    return mesh.run


def devices_said(method_dir: Path) -> str | None:
    """What a method's nodes said they trained on (each node's final record): one device, or how many nodes on
    each, most first ("18 nodes on cuda:0 (...), 2 on cpu"); None where no node said (none finished, records
    from before nodes said) or the records cannot be read."""
    try:
        finals = read_records(method_dir, containing='"final"')  # only final lines parsed: 1,000 nodes' files
    except (OSError, ValueError, EOFError):  # a damaged copy: run.json, which marks the method done, still goes
        return None
    # node -> its device: a node that recorded its end twice counts once
    said = {str(r.get("node")): r["device"] for r in finals
            if r.get("event") == "final" and isinstance(r.get("device"), str)}
    counts = Counter(said.values()).most_common()
    if len(counts) <= 1:
        return counts[0][0] if counts else None
    (first, n), *rest = counts
    return ", ".join([f"{n} nodes on {first}", *(f"{k} on {device}" for device, k in rest)])


def device_of(scenario: Scenario) -> str:
    """What the nodes train on, as run.json names it: train.device resolved on this machine (node processes
    started here resolve it alike), or as asked where it cannot be resolved here."""
    try:
        return describe_device(pick_device(scenario.train.device))
    except (ValueError, RuntimeError, AssertionError):  # no such GPU here
        return scenario.train.device


def _interrupt(flag: list[bool], task: asyncio.Task[Any]) -> None:
    flag.append(True)
    task.cancel()


def run_scenario(scenario: Scenario, out: Path, progress: Progress | None = None) -> dict[str, MethodRun]:
    """Run every method of a scenario into out/METHOD/ and write the report."""
    out.mkdir(parents=True, exist_ok=True)
    if scenario.path and Path(scenario.path).resolve() != (out / "scenario.toml").resolve():
        shutil.copy(scenario.path, out / "scenario.toml")
    # Many nodes share two cores: one torch thread per training call, two training calls at a time.
    torch.set_num_threads(1)
    allow_open_files()  # a socket per peer: as many open files as the hard limit allows (children inherit it)
    with contextlib.ExitStack() as cleanup:
        share_to = None
        if scenario.engine == "ray":  # connected to the Ray cluster for the run (or one of this machine started)
            from p2pfed.launch.ray_engine import groups_of, ray_session
            cleanup.enter_context(ray_session(scenario.ray, groups_of(scenario)))
        if scenario.processes or scenario.workers > 1 or scenario.engine == "ray":  # worker processes (this
            # machine's) map one copy of the dataset
            sweep_data_folders()
            share_to = Path(cleanup.enter_context(tempfile.TemporaryDirectory(prefix=data_folder_prefix())))
        dataset, partition = prepare_data(scenario, share_to)
        return _run_methods(scenario, out, dataset, partition, progress)


def data_folder_prefix() -> str:
    """How the folder of the dataset a run shares with its worker processes is named: by the run's process, so
    that a later run can tell a folder whose run is gone."""
    return f"p2pfed-data-{os.getpid()}-"


def sweep_data_folders() -> None:
    """Remove the shared-dataset folders of runs whose process is gone: a run killed by SIGKILL (or the machine's
    out-of-memory killer) cannot remove its own, and a Fashion-MNIST one holds 210 MB. A folder of a live process,
    or one this user may not remove, stays."""
    for folder in Path(tempfile.gettempdir()).glob("p2pfed-data-*-*"):
        pid = folder.name.split("-")[2]
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:  # gone
            shutil.rmtree(folder, ignore_errors=True)
            log.info("removed %s, the shared dataset of a run that is gone", folder)
        except (PermissionError, OverflowError):  # another user's process, or no pid at all
            continue


def _run_methods(scenario: Scenario, out: Path, dataset: Dataset, partition: Partition,
                 progress: Progress | None) -> dict[str, MethodRun]:
    from p2pfed.report.results import write_report

    shape = {
        "nodes": [scenario.node_name(i) for i in range(scenario.nodes)],
        "true_cluster": partition.true_cluster,
        "labels": [s.labels for s in partition.shards],
        "train": [len(s.train) for s in partition.shards],
        "test": [len(s.test) for s in partition.shards],  # what the report weighs micro accuracy by
        "adversaries": {scenario.node_name(a.node): a.kind for a in scenario.adversaries},
    }
    if any(s.transform != "none" for s in partition.shards):  # feature-space clusters: how each node sees
        shape["transforms"] = [s.transform for s in partition.shards]
    if dataset.task.name != "classification":  # the report adds what the task calls for (perplexity)
        shape["task"] = dataset.task.name
    (out / "partition.json").write_text(json.dumps(shape))
    runs = {}
    for method in scenario.methods:
        loop = asyncio.new_event_loop()
        loop.set_default_executor(ThreadPoolExecutor(max_workers=os.cpu_count() or 2))
        task = loop.create_task(run_method(scenario, method, dataset, partition, out / method, progress))
        # Ctrl-C (or SIGTERM: a service manager's stop, `kill`) cancels the run through the event loop, so the
        # cleanup (sockets, child processes, the shared dataset's folder) runs as ordinary code, instead of a
        # KeyboardInterrupt raised at whatever line was running, or none at all.
        interrupted: list[bool] = []
        with contextlib.suppress(ValueError, RuntimeError, NotImplementedError):  # not the main thread
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, _interrupt, interrupted, task)
        try:
            runs[method] = loop.run_until_complete(task)
        except asyncio.CancelledError:
            if not interrupted:
                raise
            raise KeyboardInterrupt from None
        except KeyboardInterrupt:
            # Ctrl-C: stop every node cleanly (the task's finally closes sockets and child processes).
            task.cancel()
            with contextlib.suppress(BaseException):
                loop.run_until_complete(task)
            raise
        finally:
            loop.run_until_complete(loop.shutdown_default_executor())
            loop.close()
    write_report(out)
    return runs


def prepare_run(path: Path, out: Path | None, methods: list[str] | None = None,
                overrides: list[str] | None = None) -> tuple[Scenario, Path]:
    """Load a scenario file (only some of its methods, or with TABLE.KEY=VALUE overrides) and make its run
    folder (by default runs/NAME-TIME); return both. A folder that holds a run of another scenario is refused:
    its report would mix the two."""
    from p2pfed.config import ConfigError, read_toml
    from p2pfed.report.seeds import is_seeds_folder

    scenario = load_checked(path, overrides or ())
    if is_seeds_folder(out or Path("-")):
        raise ConfigError(f"{out} holds a run over seeds: add to it with --seeds, or choose another --out")
    if methods:
        unknown = [m for m in methods if m not in scenario.methods]
        if unknown:
            raise ConfigError(f"--methods: {', '.join(unknown)} not among {path}'s methods "
                              f"({', '.join(scenario.methods)})")
        scenario.methods = methods
    out = out or Path("runs") / f"{scenario.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    if (out / "scenario.toml").exists():  # adding methods to a run folder: only to a run of the same scenario
        differ = scenario.differs_from(load_scenario(out / "scenario.toml", former=FORMER))
        if differ:
            raise ConfigError(f"{out} holds a run of another scenario ({', '.join(differ)} differ); its report "
                              "would mix the two: choose another --out")
    out.mkdir(parents=True, exist_ok=True)
    if overrides:  # the run folder keeps the scenario as run, and node processes read that copy
        effective = out / "scenario.toml"
        write_scenario(apply_overrides(read_toml(path), overrides), effective,
                       f"{path} with --set {' --set '.join(overrides)} (written by p2pfed run)")
        scenario.path = str(effective)
    return scenario, out


def log_to_run_folder(out: Path) -> None:
    """Every log line of every node goes to the run folder's run.log; the terminal shows only warnings."""
    handler = logging.FileHandler(out / "run.log")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s"))
    handler.setLevel(logging.INFO)
    logging.getLogger().addHandler(handler)
    logging.getLogger().setLevel(logging.INFO)
    for h in logging.getLogger().handlers:
        if h is not handler and isinstance(h, logging.StreamHandler) and h.level == logging.NOTSET:
            h.setLevel(logging.WARNING)


def check_seeds_run(path: Path, out: Path, seeds: list[int], methods: list[str] | None = None,
                    overrides: list[str] | None = None) -> Scenario:
    """Everything that could refuse a run over seeds, checked before anything is run or written; return the
    scenario (as the first seed would run it, but for the seed)."""
    from p2pfed.config import ConfigError
    from p2pfed.report.seeds import other_settings

    overrides = list(overrides or ())
    if any(o.partition("=")[0].strip() == "scenario.seed" for o in overrides):
        raise ConfigError("--seeds sets scenario.seed for each run: leave --set scenario.seed out")
    if not seeds or len(set(seeds)) != len(seeds):
        raise ConfigError(f"--seeds: give each seed once (got {seeds})")
    if (out / "partition.json").exists():
        raise ConfigError(f"{out} holds the run of one scenario, not a run over seeds: choose another --out")
    scenario = load_checked(path, overrides)
    if methods and (unknown := [m for m in methods if m not in scenario.methods]):
        raise ConfigError(f"--methods: {', '.join(unknown)} not among {path}'s methods ({', '.join(scenario.methods)})")
    if found := other_settings(out, scenario):  # the report covers every seed folder: they must hold one experiment
        folder, differ = found
        raise ConfigError(f"{folder} holds a run of other settings ({', '.join(differ)} differ); the report over "
                          "seeds would mix them: choose another --out")
    return scenario


def run_seeds(path: Path, out: Path, seeds: list[int], methods: list[str] | None = None,
              overrides: list[str] | None = None, progress: Progress | None = None) -> bool:
    """Run a scenario once per seed, each into its own run folder out/seed-S/, then write the report over the
    seeds (report/seeds.py); return whether Ctrl-C cut it short (the report then covers what ran). A method a
    seed's folder already holds to its end, with no node crashed, is not run again: the same command resumes
    an interrupted run. Everything that could refuse the run is checked before the first seed starts."""
    from p2pfed.report.seeds import complete_methods, seed_folder, write_seeds_report

    overrides = list(overrides or ())
    check_seeds_run(path, out, seeds, methods, overrides)
    try:
        for seed in seeds:
            scenario, folder = prepare_run(path, seed_folder(out, seed), methods, [*overrides, f"scenario.seed={seed}"])
            done = complete_methods(folder)
            todo = [m for m in scenario.methods if m not in done]
            if not todo:
                log.info("seed %d: every method already ran in %s", seed, folder)
                continue
            scenario.methods = todo

            def labelled(method: str, finished: int, total: int, seed: int = seed) -> None:
                if progress:
                    progress(f"{method} seed {seed}", finished, total)

            run_scenario(scenario, folder, labelled)
    except KeyboardInterrupt:
        with contextlib.suppress(Exception):
            write_seeds_report(out)
        return True
    write_seeds_report(out)
    return False


def run_interrupted(scenario: Scenario, out: Path, progress: Progress | None = None) -> bool:
    """run_scenario, but Ctrl-C ends it with the report of what ran written; return whether it was cut short."""
    from p2pfed.report.results import write_report

    try:
        run_scenario(scenario, out, progress)
    except KeyboardInterrupt:
        with contextlib.suppress(Exception):
            write_report(out)
        return True
    return False
