"""A scenario's worker processes placed by Ray (scenario.engine = "ray"): each process (a share of the nodes, or
one node) is a Ray actor on some machine of a Ray cluster, reserved its CPUs and GPU share in one placement
group, and restarted by Ray when it dies; its nodes then resume from their checkpoints. Ray only places and
supervises: the nodes talk ZeroMQ to each other and to the bootstrap (in the driver, where the runner reads the
round front from its table), exactly as `p2pfed node --scenario` processes do. Records reach the run folder
directly where an actor's machine sees it (this machine, a shared file system), else they are sent back to the
driver when the actor's nodes end.

Ray is an optional extra (pip install -e '.[ray]'); nothing here imports it until a run asks for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import tempfile
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from p2pfed.config import ConfigError
from p2pfed.launch.runner import SHARED_DATA, ProcessMesh, keys_folder, member
from p2pfed.scenario.config import Scenario
from p2pfed.wire.messages import clip

log = logging.getLogger(__name__)

TOKEN = ".engine-token"  # a run folder's proof to an actor that it sees the driver's folder, not another's
PLACE_WAIT = 120.0  # seconds to wait for the cluster to reserve every worker process's resources
STOP_WAIT = 30.0  # seconds a worker process is given to stop its nodes before it is killed
LOOPBACK = "127.0.0.1"


def require_ray() -> Any:
    """The ray module, or a one-line error that says which extra to install."""
    try:
        import ray
    except ImportError:
        raise ConfigError("scenario.engine = \"ray\" needs Ray, which p2pfed does not install by default: "
                          "pip install -e '.[ray]' (or pip install ray)") from None
    return ray


def groups_of(scenario: Scenario) -> int:
    """How many worker processes Ray places for a method: one per node (processes = true), else workers."""
    return scenario.nodes if scenario.processes else scenario.workers


@contextlib.contextmanager
def ray_session(scenario: Scenario) -> Iterator[None]:
    """Connected to the scenario's Ray cluster for the run ([ray] address), or to a cluster of this machine
    alone started for it and stopped after; a process already connected (a Ray job) stays so."""
    ray = require_ray()
    if ray.is_initialized():
        yield
        return
    config = scenario.ray
    options: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False,
                               "logging_level": logging.WARNING}
    if config.address:
        options["address"] = config.address
    else:
        # This machine alone. Its CPUs are logical here: the local runner, too, starts as many processes as the
        # scenario asks, however many cores there are; Ray is given enough to place them all.
        options["num_cpus"] = max(os.cpu_count() or 1, int(groups_of(scenario) * config.cpus + 0.999))
    with warnings.catch_warnings():  # Ray's notice of a future default for GPU-less actors: not the user's
        warnings.simplefilter("ignore", FutureWarning)
        try:
            ray.init(**options)
        except ConnectionError as exc:
            raise ConfigError(f"ray.address {config.address!r}: no Ray cluster answered ({clip(str(exc), 160)}); "
                              "start one with `ray start --head`, or leave ray.address empty to run on this "
                              "machine alone") from None
    try:
        yield
    finally:
        ray.shutdown()


def bind_host(ray: Any) -> str:
    """Where the members of a run listen: loopback when every machine of the cluster is this one (nothing
    leaves it), else each machine's own address in the cluster, which its peers reach it by."""
    me = ray.util.get_node_ip_address()
    machines = {n["NodeManagerAddress"] for n in ray.nodes() if n.get("Alive")}
    return LOOPBACK if machines <= {me} else me


class NodeGroup:
    """One worker process of a scenario's run, as a Ray actor: the nodes of some indices, run as
    `p2pfed node --scenario FILE --index ...` runs them, until they end or the driver stops them."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.stopping: asyncio.Event | None = None

    def folder(self) -> tuple[Path, bool]:
        """Where this process writes its nodes' records and checkpoints, and whether it is the driver's run
        folder: it is when the token the driver wrote there reads the same here, else a folder of this machine
        named by the token (a restarted actor on the same machine finds its nodes' checkpoints there)."""
        out = Path(self.spec["out"])
        with contextlib.suppress(OSError):
            if (out / TOKEN).read_text() == self.spec["token"]:
                return out, True
        local = Path(tempfile.gettempdir()) / f"p2pfed-ray-{self.spec['token']}"
        local.mkdir(parents=True, exist_ok=True)
        return local, False

    async def run(self) -> dict[str, bytes]:
        """Run the nodes to their end; return the files they wrote when the driver cannot see them (name ->
        bytes, the run folder's top level), else nothing."""
        import ray

        from p2pfed.config import NodeConfig
        from p2pfed.launch.member import run_learning_nodes

        spec = self.spec
        out, shared = self.folder()
        handler = logging.FileHandler(out / spec["log"])
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s"))
        logging.getLogger().addHandler(handler)
        logging.getLogger().setLevel(logging.INFO)
        host = LOOPBACK if spec["loopback"] else ray.util.get_node_ip_address()
        log.info("worker process %d on %s (Ray node %s) runs %s", os.getpid(), host,
                 ray.get_runtime_context().get_node_id()[:12], ", ".join(spec["names"]))
        scenario_path = Path(spec["scenario"])
        if not shared:  # the scenario as the driver runs it, --set overrides included
            log.info("the run folder %s is not seen here: records go to %s and are sent to the driver at the end",
                     spec["out"], out)
            scenario_path = out / "scenario.toml"
            scenario_path.write_text(spec["scenario_text"])
        if spec["shared_data"] and Path(spec["shared_data"]).is_dir():  # the driver's copy, on the same machine
            os.environ[SHARED_DATA] = spec["shared_data"]
        cfg = NodeConfig(bind=f"tcp://{host}:0", join=[spec["ticket"]],
                         keys="" if spec["insecure"] else str(keys_folder(out)))
        cfg.mesh.mesh = spec["mesh"]
        cfg.mesh.insecure = spec["insecure"]
        self.stopping = asyncio.Event()
        try:
            await run_learning_nodes(cfg, scenario_path, spec["indices"], spec["method"], out, self.stopping,
                                     start_round=spec["start_round"], wait_for=spec["wait_for"],
                                     send_delay=spec["send_delay"])
        finally:
            logging.getLogger().removeHandler(handler)
            handler.close()
        if shared:
            return {}
        return {p.name: p.read_bytes() for p in out.iterdir()
                if p.is_file() and p.name != "scenario.toml" and not p.name.startswith(".")}

    async def stop(self) -> None:
        """Stop the nodes (they leave the mesh); run returns."""
        if self.stopping is not None:
            self.stopping.set()


@dataclass
class Group:
    """The driver's handle on one worker process."""

    indices: list[int]
    actor: Any
    ref: Any  # the run call's result
    done: bool = False
    names: list[str] = field(default_factory=list)


class RayMesh(ProcessMesh):
    """A method's nodes in worker processes placed by Ray; the bootstrap in this process, listening where the
    actors reach it. Progress comes from the rounds nodes report in heartbeats, as with local processes."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.ray = require_ray()
        self.groups: dict[int, Group] = {}  # node index -> its worker process
        self.token = secrets.token_hex(16)
        self.placement: Any = None
        self.slots: dict[int, int] = {}  # node index -> its bundle in the placement group

    async def start(self) -> None:
        from ray.util.placement_group import placement_group

        ray, config = self.ray, self.scenario.ray
        self.host = bind_host(ray)
        (self.out / TOKEN).write_text(self.token)
        bundle = {"CPU": config.cpus, **({"GPU": config.gpus} if config.gpus else {})}
        count = groups_of(self.scenario)
        self.placement = placement_group([dict(bundle) for _ in range(count)], strategy=config.placement.upper(),
                                         name=f"p2pfed-{self.options.mesh}-{self.token[:8]}")
        if not await asyncio.to_thread(self.placement.wait, PLACE_WAIT):
            raise ConfigError(f"Ray could not reserve {count} worker processes of {bundle} within {PLACE_WAIT:.0f} s "
                              f"(the cluster has {clip(str(ray.cluster_resources()), 200)}): lower ray.cpus, "
                              "ray.gpus or scenario.workers, or add machines to the cluster")
        log.info("%s: %d worker processes placed by Ray (%s), members listening on %s", self.method, count,
                 config.address or "a cluster of this machine", self.host)
        self.boot = member(self.scenario, self.method, "bootstrap", self.out, "bootstrap")
        await self.boot.start(f"tcp://{self.host}:0")

    def slot(self, indices: list[int]) -> int:
        """The placement group bundle a worker process takes: a node's own (processes = true), else its group's
        number, kept across restarts."""
        first = indices[0]
        if first not in self.slots:
            self.slots[first] = first if self.scenario.processes else len(self.slots)
        return self.slots[first]

    async def start_group(self, indices: list[int], start_round: int = 0, wait_for: int = 0, via: int = -1) -> None:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        ray, config = self.ray, self.scenario.ray
        names = [self.scenario.node_name(i) for i in indices]
        first = self.starting = names[0]
        log_name = f"{first}.log" if len(indices) == 1 else f"{first}-group.log"
        spec = {
            "indices": indices, "names": names, "method": self.method, "out": str(self.out.resolve()),
            "token": self.token, "scenario": str(Path(self.scenario.path).resolve()),
            "scenario_text": Path(self.scenario.path).read_text(), "ticket": self.entry(via),
            "mesh": self.options.mesh, "insecure": self.options.insecure, "start_round": start_round,
            "wait_for": wait_for, "send_delay": max(self.delays.get(i, 0.0) for i in indices),
            "loopback": self.host == LOOPBACK, "log": log_name,
            "shared_data": str(self.dataset.mapped_from) if self.dataset.mapped_from is not None else "",
        }
        actor = ray.remote(NodeGroup).options(
            num_cpus=config.cpus, num_gpus=config.gpus, max_restarts=config.restarts,
            max_task_retries=-1 if config.restarts else 0,  # a restarted actor runs its nodes again
            max_concurrency=4,  # run, and stop beside it
            scheduling_strategy=PlacementGroupSchedulingStrategy(self.placement,
                                                                 placement_group_bundle_index=self.slot(indices)),
        ).remote(spec)
        group = Group(indices, actor, actor.run.remote(), names=names)
        for i in indices:
            self.groups[i] = group
            self.logs[i] = self.out / log_name

    def present(self) -> list[str]:
        return [self.scenario.node_name(i) for i in self.groups]

    def _finish(self, group: Group, result: Any) -> None:
        """A worker process's run ended: keep the files it sent back, or tell why it failed."""
        group.done = True
        if isinstance(result, BaseException):
            cause = getattr(result, "cause", None) or result
            for name in group.names:
                self.run.crashed.setdefault(name, clip(f"worker process failed: {cause!r}", 300))
            return
        for name, data in result.items():  # our own actor's files, but a name is still only a name
            if "/" not in name and not name.startswith("."):
                (self.out / name).write_bytes(data)

    def _collect(self, group: Group, timeout: float) -> None:
        if group.done:
            return
        try:
            result = self.ray.get(group.ref, timeout=timeout)
        except self.ray.exceptions.GetTimeoutError:
            raise
        except Exception as exc:
            result = exc
        self._finish(group, result)

    def running(self) -> bool:
        pending = {id(g): g for g in self.groups.values() if not g.done}
        if pending:
            ready, _ = self.ray.wait([g.ref for g in pending.values()], num_returns=len(pending), timeout=0)
            for group in pending.values():
                if group.ref in ready:
                    self._collect(group, 0)
        return any(not g.done for g in self.groups.values())

    def rounds(self) -> dict[int, int]:
        assert self.boot is not None
        table = self.boot.peers.peers
        return {i: table[self.scenario.node_name(i)].round for i in self.groups
                if self.scenario.node_name(i) in table}

    async def stop_node(self, index: int, crash: bool) -> None:
        group = self.groups.pop(index, None)
        if group is None:
            return
        for other in [i for i, g in self.groups.items() if g is group]:
            del self.groups[other]
        if crash:  # a scripted crash: gone at once, and not restarted by Ray (the script restarts it)
            self.ray.kill(group.actor, no_restart=True)
            group.done = True
            return
        if not group.done:
            group.actor.stop.remote()
            try:
                await asyncio.to_thread(self._collect, group, STOP_WAIT)
            except self.ray.exceptions.GetTimeoutError:
                log.warning("worker process of %s did not stop within %.0f s; killing it", group.names[0], STOP_WAIT)
        self.ray.kill(group.actor, no_restart=True)

    async def close(self) -> None:
        from ray.util.placement_group import remove_placement_group

        try:  # every worker process asked to stop at once, then waited for together
            await asyncio.gather(*(self.stop_node(i, crash=False) for i in list(self.groups)))
            if self.boot is not None:
                await self.boot.stop()
        finally:
            if self.placement is not None:
                remove_placement_group(self.placement)
            with contextlib.suppress(OSError):
                (self.out / TOKEN).unlink()

