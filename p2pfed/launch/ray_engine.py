"""A scenario's worker processes placed by Ray (scenario.engine = "ray"): each process (a share of the nodes, or
one node) is a Ray actor on some machine of a Ray cluster, reserved its CPUs and GPU share in one placement
group, and restarted by Ray when it dies; its nodes then resume from their checkpoints. Ray only places and
supervises: the nodes talk ZeroMQ to each other and to the bootstrap (in the driver, where the runner reads the
round front from its table), exactly as `p2pfed node --scenario` processes do. Records reach the run folder
directly where an actor's machine sees it (this machine, a shared file system), else its nodes' records and its log
are sent back to the driver when they end (checkpoints and models stay on that machine).

Ray runs code it is sent, unpickled, on every machine of its cluster: the cluster is one trust domain, and Ray's
token authentication keeps others out of it. A cluster of this machine started for a run gets a token of its own;
a run at an address refuses a cluster reached without one, unless told it is on a trusted network
(ray.authenticated = false). Nothing from the mesh goes through Ray: models travel on the checked ZeroMQ wire.

Ray is an optional extra (pip install -e '.[ray]'); nothing here imports it until a run asks for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import secrets
import socket
import sys
import tempfile
import warnings
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from p2pfed.config import ConfigError
from p2pfed.launch.runner import SHARED_DATA, ProcessMesh, keys_folder, member
from p2pfed.scenario.config import RayConfig, Scenario
from p2pfed.wire.messages import clip, cut

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
        raise ConfigError("Ray is needed here, and p2pfed does not install it by default: pip install -e '.[ray]' "
                          "(or pip install 'ray>=2.52')") from None
    return ray


def local_token() -> None:
    """Token authentication for a cluster of this machine started by this process: a token of its own, in the
    environment Ray reads it from (its own processes, started by this one, inherit it). Ray reads the mode when it
    is imported: a process that imported it without token authentication is told so."""
    if "ray" in sys.modules and os.environ.get("RAY_AUTH_MODE") != "token":
        log.warning("Ray was imported before its token authentication could be set: this machine's cluster takes "
                    "anyone's code on its ports for the run")
        return
    os.environ["RAY_AUTH_MODE"] = "token"
    os.environ.setdefault("RAY_AUTH_TOKEN", secrets.token_hex(32))


def check_authenticated(config: RayConfig) -> None:
    """A cluster at an address is joined only with Ray's token authentication on (RAY_AUTH_MODE=token, the
    cluster's token in ~/.ray/auth_token or RAY_AUTH_TOKEN), or where the user said its network is trusted."""
    if os.environ.get("RAY_AUTH_MODE") == "token":
        return
    if config.authenticated:
        raise ConfigError(f"the Ray cluster at {config.address} is reached without Ray's token authentication, "
                          "so anyone who reaches its ports could run code on its machines: start every machine "
                          "and this command with RAY_AUTH_MODE=token and the cluster's token (docs/ray.md), or set "
                          "ray.authenticated = false on a network where every host is trusted")
    log.warning("ray.authenticated = false: the Ray cluster at %s runs without token authentication; anyone who "
                "reaches its ports can run code on its machines", config.address)


HEAD_WAIT = 5.0  # seconds a cluster's head is given to accept a connection before the command says it is not there


def head_answers(address: str, wait: float = HEAD_WAIT) -> None:
    """A head that is not there is said in a line at once: Ray itself retries one for minutes (over 5 here, when a
    test gave up on it), printing its own warnings. "auto" and what is not HOST:PORT (or ray://HOST:PORT) are left
    to Ray."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=wait).close()
    except OSError as exc:
        # the reason is this machine's own words (connection refused, timed out), not the network's
        raise ConfigError(f"nothing answers at {clip(address, 80)} ({exc.strerror or exc or 'no answer'}): is the "
                          "cluster's head started there (`ray start --head`), and is its port reachable "
                          "from this machine?") from None


@contextlib.contextmanager
def ray_session(config: RayConfig, processes: int) -> Iterator[None]:
    """Connected to the Ray cluster at config.address (or RAY_ADDRESS's) for the run, or to a cluster of this
    machine alone started for it (able to place processes actors of config.cpus CPUs) and stopped after; a process
    already connected (a Ray job's driver) stays so."""
    address = config.address or os.environ.get("RAY_ADDRESS", "")
    if not address and "ray" not in sys.modules:
        local_token()
    ray = require_ray()
    if ray.is_initialized():
        yield
        return
    if address:
        check_authenticated(dataclasses.replace(config, address=address))
        head_answers(address)
    options: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False,
                               "logging_level": logging.WARNING}
    options["address"] = address or "local"  # "local": a new cluster, even where one runs already
    if not address:
        # This machine alone. Its CPUs are logical here: the local runner, too, starts as many processes as the
        # scenario asks, however many cores there are; Ray is given enough to place them all.
        options["num_cpus"] = max(os.cpu_count() or 1, int(processes * config.cpus + 0.999))
    with warnings.catch_warnings():  # Ray's notice of a future default for GPU-less actors (gpus_hidden says it)
        warnings.simplefilter("ignore", FutureWarning)
        try:
            ray.init(**options)
        except (ConnectionError, RuntimeError, ray.exceptions.RayError) as exc:
            raise ConfigError(f"Ray at {address or 'this machine'} could not be joined: {clip(str(exc), 200)} (a "
                              "cluster is started with `ray start --head`; leave ray.address empty to run on this "
                              "machine alone)") from None
    try:
        yield
    finally:
        ray.shutdown()


def gpus_hidden(device: str, gpus: float, what: str) -> None:
    """Ray hides every GPU from an actor given none: a device that needs one is refused, "auto" trains on CPU."""
    if gpus == 0 and device.startswith("cuda"):
        raise ConfigError(f"train.device = {device!r}, but Ray gives {what} no GPU: set a GPU share (ray.gpus, "
                          "--gpus; 0.25 has four share one) or train.device = \"cpu\"")


def groups_of(scenario: Scenario) -> int:
    """How many worker processes Ray places for a method: one per node (processes = true), else workers."""
    return scenario.nodes if scenario.processes else scenario.workers


def machines(ray: Any) -> dict[str, str]:
    """The cluster's live machines: address -> Ray node id."""
    return {n["NodeManagerAddress"]: n["NodeID"] for n in ray.nodes() if n.get("Alive")}


def bind_host(ray: Any) -> str:
    """Where the members of a run listen: loopback when every machine of the cluster is this one (nothing
    leaves it), else each machine's own address in the cluster, which its peers reach it by."""
    me = ray.util.get_node_ip_address()
    return LOOPBACK if set(machines(ray)) <= {me} else me


def actor_options(config: RayConfig, strategy: Any) -> dict[str, Any]:
    """How Ray runs one of our actors: its CPUs and GPU share, restarted up to config.restarts times with its run
    call made again (its nodes resume from their checkpoints), stop callable beside run, placed by strategy."""
    return {"num_cpus": config.cpus, "num_gpus": config.gpus, "max_restarts": config.restarts,
            "max_task_retries": -1 if config.restarts else 0, "max_concurrency": 4,
            "scheduling_strategy": strategy}


def write_back(result: dict[str, Any], out: Path) -> str | None:
    """What an actor's run returned: write the files it sent back into out (a name is only a name: no folder,
    nothing hidden); return why it failed, if it did."""
    for name, data in result.get("files", {}).items():
        if isinstance(name, str) and "/" not in name and not name.startswith(".") and isinstance(data, bytes):
            (out / name).write_bytes(data)
    return result.get("error")


def collect(ray: Any, ref: Any, out: Path, timeout: float = 0) -> str | None:
    """An actor's run ended (or ends within timeout, else GetTimeoutError): write the files it sent back into
    out; return why it failed, if it did."""
    try:
        return write_back(ray.get(ref, timeout=timeout), out)
    except ray.exceptions.GetTimeoutError:
        raise
    except Exception as exc:  # its process died past its restarts, or Ray lost it
        return why_failed(exc)


def why_failed(exc: BaseException) -> str:
    """One line for a failure of an actor's members, or for an actor that Ray could not run to its end (its process
    died past its restarts: the cause Ray carries)."""
    cause = getattr(exc, "cause", None) or exc
    return cut(f"{type(cause).__name__}: {cause}", 300)


class Placed:
    """A Ray actor that runs members of a mesh until they end or the driver stops them, writing where the driver
    sees it if it can (spec: names, out, token, log, loopback, and what the kind of actor runs)."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.stopping = asyncio.Event()  # made here: a stop may come before run has begun
        self.handler: logging.Handler | None = None
        self.where: tuple[Path, bool] | None = None  # folder()

    def private(self) -> Path:
        """A folder of this machine that is this actor's alone (its first member's name, under the run's token),
        readable by its user only; a restarted actor on the same machine finds it again."""
        folder = Path(tempfile.gettempdir()) / f"p2pfed-ray-{self.spec['token']}"
        folder.mkdir(mode=0o700, exist_ok=True)
        own = folder / self.spec["names"][0]
        own.mkdir(mode=0o700, exist_ok=True)
        return own

    def folder(self) -> tuple[Path, bool]:
        """Where this process writes its members' records and checkpoints, and whether it is the driver's run
        folder: it is when the token the driver wrote there reads the same here, else the private folder. Decided
        once a process (the token is taken away once the run ends)."""
        if self.where is None:
            out = Path(self.spec["out"])
            self.where = self.private(), False
            with contextlib.suppress(OSError):
                if (out / TOKEN).read_text() == self.spec["token"]:
                    self.where = out, True
        return self.where

    def begin(self, out: Path, shared: bool) -> str:
        """Log to the actor's file in out, say where it runs; return the host its members listen on."""
        import ray

        self.handler = logging.FileHandler(out / self.spec["log"])
        self.handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s"))
        logging.getLogger().addHandler(self.handler)
        logging.getLogger().setLevel(logging.INFO)
        host = LOOPBACK if self.spec["loopback"] else ray.util.get_node_ip_address()
        log.info("worker process %d on %s (Ray node %s) runs %s", os.getpid(), host,
                 ray.get_runtime_context().get_node_id()[:12], ", ".join(self.spec["names"]))
        if not shared:
            log.info("the run folder %s is not seen here: records go to %s and are sent to the driver at the end",
                     self.spec["out"], out)
        return host

    def settings(self, key: str) -> Path:
        """The driver's scenario or recipe file (spec[key + "_text"]), written to the private folder: the file
        at the driver's path may not be there, or not the same, on this machine."""
        path = self.private() / f"{key}.toml"
        path.write_text(self.spec[key + "_text"])
        return path

    async def run_members(self, members: Callable[[Path, str], Awaitable[None]]) -> dict[str, Any]:
        """Run members(out, host) to their end; return why they failed (error, if they did) and the files they
        wrote that the driver cannot see: their records and this actor's log (files, by name)."""
        out, shared = self.folder()
        host = self.begin(out, shared)
        error = None
        try:
            await members(out, host)
        except Exception as exc:  # told to the driver with what was written; Ray restarts only a dead process
            log.exception("%s failed", ", ".join(self.spec["names"]))
            error = why_failed(exc)
        finally:
            if self.handler is not None:
                logging.getLogger().removeHandler(self.handler)
                self.handler.close()
        return {"files": self.gathered(out, shared), "error": error}

    def gathered(self, out: Path, shared: bool) -> dict[str, bytes]:
        """The files the driver cannot see (none where it sees out): its members' records and this actor's log."""
        keep = {f"{name}.jsonl" for name in self.spec["names"]} | {self.spec["log"]}
        return {} if shared else {name: (out / name).read_bytes() for name in keep if (out / name).is_file()}

    async def stop(self) -> None:
        """Stop the members (they leave the mesh); run returns."""
        self.stopping.set()

    async def ready(self) -> bool:
        """Answered once Ray has placed this actor and started its process."""
        return True


class NodeGroup(Placed):
    """One worker process of a scenario's run, as a Ray actor: the nodes of some indices, run as
    `p2pfed node --scenario FILE --index ...` runs them."""

    async def run(self) -> dict[str, Any]:
        """Run the nodes to their end (Placed.run_members)."""
        from p2pfed.config import NodeConfig
        from p2pfed.launch.member import run_learning_nodes

        spec = self.spec

        async def nodes(out: Path, host: str) -> None:
            if spec["shared_data"] and Path(spec["shared_data"]).is_dir():  # the driver's copy, on its machine
                os.environ[SHARED_DATA] = spec["shared_data"]
            cfg = NodeConfig(bind=f"tcp://{host}:0", join=[spec["ticket"]],
                             keys="" if spec["insecure"] else str(keys_folder(out)))
            cfg.mesh.mesh = spec["mesh"]
            cfg.mesh.insecure = spec["insecure"]
            await run_learning_nodes(cfg, self.settings("scenario"), spec["indices"], spec["method"], out,
                                     self.stopping, start_round=spec["start_round"], wait_for=spec["wait_for"],
                                     send_delay=spec["send_delay"])

        return await self.run_members(nodes)


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

    def device(self) -> str:
        gpus = self.scenario.ray.gpus
        if not gpus:  # Ray hides every GPU from an actor given none: "auto" finds none there
            return "cpu"
        return RayMesh.placed_on(self.scenario.train.device, gpus)

    def placed(self, devices: str) -> str:
        return RayMesh.placed_on(devices, self.scenario.ray.gpus)

    @staticmethod
    def placed_on(devices: str, gpus: float) -> str:
        """The devices the nodes said (or train.device before they say), and each worker process's share of a GPU."""
        return f"{devices}, placed by Ray with {gpus:g} GPU a worker process" if gpus else devices

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
            "token": self.token, "scenario_text": Path(self.scenario.path).read_text(), "ticket": self.entry(via),
            "mesh": self.options.mesh, "insecure": self.options.insecure, "start_round": start_round,
            "wait_for": wait_for, "send_delay": max(self.delays.get(i, 0.0) for i in indices),
            "loopback": self.host == LOOPBACK, "log": log_name,
            "shared_data": str(self.dataset.mapped_from) if self.dataset.mapped_from is not None else "",
        }
        strategy = PlacementGroupSchedulingStrategy(self.placement, placement_group_bundle_index=self.slot(indices))
        actor = ray.remote(NodeGroup).options(**actor_options(config, strategy)).remote(spec)
        group = Group(indices, actor, actor.run.remote(), names=names)
        for i in indices:
            self.groups[i] = group
            self.logs[i] = self.out / log_name

    def indices(self) -> list[int]:
        return list(self.groups)

    def _collect(self, group: Group, timeout: float) -> None:
        """A worker process's run ended (or ends within timeout): keep the files it sent back, tell why it
        failed if it did."""
        if group.done:
            return
        error = collect(self.ray, group.ref, self.out, timeout)
        group.done = True
        for name in group.names if error else ():
            self.run.crashed.setdefault(name, f"worker process failed: {error}")

    def running(self) -> bool:
        pending = {id(g): g for g in self.groups.values() if not g.done}
        if pending:
            ready, _ = self.ray.wait([g.ref for g in pending.values()], num_returns=len(pending), timeout=0)
            for group in pending.values():
                if group.ref in ready:
                    self._collect(group, 0)
        return any(not g.done for g in self.groups.values())

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

