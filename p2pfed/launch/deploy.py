"""p2pfed deploy: a mesh of nodes with their own data, started on the machines of a Ray cluster from one command.

Each `--data [NAME=]HOST:PATH` is one node: a Ray actor pinned to the machine HOST (a hard node affinity) that runs
what `p2pfed node --recipe RECIPE --data PATH --name NAME` runs there, data read on that machine and never sent.
The bootstrap runs in this process, as `p2pfed bootstrap` would; its ticket is printed, so more nodes can join by
hand. Ray restarts a node's process that dies, and the node resumes from its checkpoint. The command stays until
every node ends (the recipe's rounds) or Ctrl-C, which stops them all; each node's records and log come back to the
deploy folder, its checkpoint and personalised model stay on its machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from p2pfed.config import ConfigError, NodeConfig
from p2pfed.launch.member import make_endpoint, run_own_node, use_scenario_mesh
from p2pfed.launch.ray_engine import (
    LOOPBACK,
    PLACE_WAIT,
    STOP_WAIT,
    TOKEN,
    Placed,
    actor_options,
    bind_host,
    collect,
    gpus_hidden,
    machines,
    require_ray,
    why_failed,
)
from p2pfed.report.records import read_record_file
from p2pfed.scenario.config import RayConfig
from p2pfed.wire.messages import clip, is_name

log = logging.getLogger(__name__)

Progress = Callable[[str, int, int], None]  # ("deploy", rounds done by every node, the recipe's rounds)


@dataclass(frozen=True)
class Placement:
    """One node of a deployment: its name, the machine it runs on, and its data's path there."""

    name: str
    host: str
    data: str


def parse_placement(text: str, cwd: Path) -> Placement:
    """--data [NAME=]HOST:PATH; NAME defaults to the data file's stem; a relative PATH is taken from cwd (the
    machines share a layout, as they share the recipe's path)."""
    head, sep, path = text.partition(":")
    name, _, host = head.rpartition("=")
    if not sep or not host or not path:
        raise ConfigError(f"--data {clip(text, 80)}: give [NAME=]HOST:PATH, e.g. a=10.0.0.2:/data/a.npz")
    name = name or Path(path).stem
    if not is_name(name):
        raise ConfigError(f"--data {clip(text, 80)}: the node's name {clip(name, 40)} must be up to 64 letters, "
                          "digits, '-', '_' or '.' (give one: NAME=HOST:PATH)")
    full = Path(path) if Path(path).is_absolute() else cwd / path
    return Placement(name, host, str(full))


class OwnNode(Placed):
    """One node with its own data, as a Ray actor on the machine that holds the data."""

    def __init__(self, spec: dict[str, Any]) -> None:
        super().__init__(spec)
        self.task: asyncio.Task[dict[str, Any]] | None = None  # a detached deployment's run (start)
        self.finishing = False  # asked to finish: never begun again

    async def run(self) -> dict[str, Any]:
        """Run the node to its end (Placed.run_members)."""
        spec = self.spec

        async def node(out: Path, host: str) -> None:
            # its key pair where `p2pfed node` keeps it on this machine (~/.p2pfed/keys): the mesh knows it by it
            cfg = NodeConfig(name=spec["names"][0], bind=f"tcp://{host}:0", join=[spec["ticket"]])
            cfg.mesh.mesh = spec["mesh"]
            cfg.mesh.insecure = spec["insecure"]
            await run_own_node(cfg, self.settings("recipe"), Path(spec["data"]), spec["method"], out, self.stopping,
                               wait_for=spec["wait_for"])

        return await self.run_members(node)

    # -- a detached deployment (launch/detached.py): no caller waits on run, the actor runs it itself ------------
    async def start(self) -> bool:
        """Begin the run in this actor's own loop unless it has begun or the node was asked to finish; True if it
        begins now. Its supervisor asks again and again, so a process Ray restarted (this actor anew, nothing begun)
        runs the node again, which resumes from its checkpoint."""
        if self.task is not None or self.finishing:
            return False
        self.task = asyncio.ensure_future(self.run())
        return True

    async def state(self) -> dict[str, Any]:
        """Where the run stands: waiting (not begun: a process just restarted), running, failed (why) or finished
        (its final record's accuracy and chosen peers)."""
        if self.task is None:
            return {"state": "waiting"}
        if not self.task.done():
            return {"state": "running"}
        error: str | None
        if self.task.cancelled():
            error = "its run was cancelled"
        elif (exc := self.task.exception()) is not None:
            error = why_failed(exc)
        else:
            error = self.task.result().get("error")
        if error:
            return {"state": "failed", "why": error}
        return {"state": "finished", **self.final()}

    def final(self) -> dict[str, Any]:
        """The node's final accuracy and chosen peers, from its records file ({} before its end)."""
        path = self.folder()[0] / f"{self.spec['names'][0]}.jsonl"
        with contextlib.suppress(OSError):
            for record in reversed(read_record_file(path, '"final"')):
                if record.get("event") == "final":
                    return {"accuracy": record.get("accuracy"), "chosen": record.get("chosen") or []}
        return {}

    async def finish(self) -> dict[str, Any]:
        """Stop the node if it still runs (it leaves the mesh; it is not begun again after this) and return what its
        run returned, with cut_short true if it was still running, and its final accuracy and chosen peers."""
        self.finishing = True
        if self.task is None:  # not begun here (its process restarted): what the old one wrote comes back all the same
            out, shared = self.folder()
            return {"files": self.gathered(out, shared), "cut_short": True, "final": {},
                    "error": "its process was restarted by Ray and had not begun again"}
        cut_short = not self.task.done()
        self.stopping.set()
        try:
            result = dict(await self.task)
        except (Exception, asyncio.CancelledError) as exc:  # told, not raised: the other nodes still stop
            result = {"files": {}, "error": why_failed(exc)}
        return {**result, "cut_short": cut_short, "final": self.final()}

    async def placement(self) -> dict[str, Any]:
        """This node as deployed (name, machine, deploy folder and its token): a deployment whose supervisor is gone
        is still found, and stopped, by its nodes."""
        return {"name": self.spec["names"][0], "host": self.spec["host"], "out": self.spec["out"],
                "token": self.spec["token"]}


def check_deploy(recipe_path: Path, placements: list[Placement], method: str | None, config: RayConfig) -> str:
    """Everything that could refuse a deployment, checked before Ray is started; return the method to run."""
    from p2pfed.methods import check_method, is_central, load_checked

    recipe = load_checked(recipe_path)
    method = method or recipe.methods[0]
    check_method(method, recipe)
    if is_central(method):
        raise ConfigError(f"--method {method} is a coordinated method: p2pfed deploy starts peer-to-peer nodes (a "
                          "coordinator across machines: docs/deploy.md)")
    names = [p.name for p in placements]
    if len(set(names)) < len(names):
        raise ConfigError(f"--data: each node needs a name of its own ({', '.join(sorted(names))}): NAME=HOST:PATH")
    gpus_hidden(recipe.train.device, config.gpus, "a deployed node")
    return method


def cluster_of(ray: Any, placements: list[Placement]) -> dict[str, str]:
    """The cluster's machines, address -> Ray node id (this machine also as localhost and 127.0.0.1); raise
    ConfigError naming a placement's machine that is not one of them."""
    cluster = machines(ray)
    here = ray.util.get_node_ip_address()
    if here in cluster:  # this machine by any of its names
        cluster.update(dict.fromkeys(("localhost", LOOPBACK), cluster[here]))
    unknown = sorted({p.host for p in placements} - set(cluster))
    if unknown:
        known = sorted(m for m in cluster if m not in ("localhost", LOOPBACK))
        raise ConfigError(f"--data: {', '.join(unknown)} is no machine of the Ray cluster (its machines: "
                          f"{', '.join(known)})")
    return cluster


def node_spec(p: Placement, recipe_path: Path, method: str, out: Path, token: str, ticket: str, mesh: str,
              insecure: bool, nodes: int, loopback: bool) -> dict[str, Any]:
    """What OwnNode needs to run placement p's node (it waits for the deployment's other nodes before round 0)."""
    return {"names": [p.name], "data": p.data, "recipe_text": recipe_path.read_text(), "method": method,
            "out": str(out.resolve()), "token": token, "ticket": ticket, "mesh": mesh, "insecure": insecure,
            "host": p.host, "wait_for": nodes - 1, "loopback": loopback, "log": f"{p.name}.log"}


async def await_placed(ray: Any, actors: dict[str, Any], placements: list[Placement], config: RayConfig) -> None:
    """Wait until Ray has started every actor's process; raise ConfigError naming those it could not place."""
    placed = {name: actor.ready.remote() for name, actor in actors.items()}
    ready, _ = await asyncio.to_thread(ray.wait, list(placed.values()), num_returns=len(placed), timeout=PLACE_WAIT)
    if len(ready) < len(placed):
        waiting = [f"{name} ({next(p.host for p in placements if p.name == name)})"
                   for name, ref in placed.items() if ref not in ready]
        raise ConfigError(f"Ray could not start {', '.join(waiting)} within {PLACE_WAIT:.0f} s: a machine "
                          f"without --cpus {config.cpus:g}" + (f" and --gpus {config.gpus:g}" if config.gpus
                                                               else "") + " free")


async def deploy(recipe_path: Path, placements: list[Placement], out: Path, stop: asyncio.Event, *,
                 method: str, mesh: str, insecure: bool, config: RayConfig, port: int = 0,
                 progress: Progress | None = None, started: Callable[[str], None] | None = None) -> dict[str, str]:
    """Start the placements' nodes on their machines and a bootstrap here (its ticket told to started), run them
    until they end or stop is set; return each node that did not finish with why. Ray must be connected, and
    check_deploy have passed."""
    ray = require_ray()
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from p2pfed.methods import load_checked

    recipe = load_checked(recipe_path)
    cluster = cluster_of(ray, placements)
    host = bind_host(ray)
    token = secrets.token_hex(16)
    cfg = NodeConfig(name="bootstrap", bind=f"tcp://{host}:{port}")
    use_scenario_mesh(cfg, recipe)
    cfg.mesh.mesh, cfg.mesh.insecure = mesh, insecure or cfg.mesh.insecure
    boot = make_endpoint(cfg, "bootstrap")
    actors: dict[str, Any] = {}
    failed: dict[str, str] = {}
    out.mkdir(parents=True, exist_ok=True)
    try:
        (out / TOKEN).write_text(token)
        await boot.start(cfg.bind)
        if started:
            started(boot.ticket)
        for p in placements:
            spec = node_spec(p, recipe_path, method, out, token, boot.ticket, mesh, cfg.mesh.insecure, len(placements),
                             host == LOOPBACK)
            strategy = NodeAffinitySchedulingStrategy(cluster[p.host], soft=False)
            actors[p.name] = ray.remote(OwnNode).options(**actor_options(config, strategy)).remote(spec)
        await await_placed(ray, actors, placements, config)
        pending = {name: actor.run.remote() for name, actor in actors.items()}
        while pending and not stop.is_set():
            ready, _ = ray.wait(list(pending.values()), num_returns=len(pending), timeout=0)
            for name in [n for n, r in pending.items() if r in ready]:
                if error := collect(ray, pending.pop(name), out):
                    failed[name] = error
            if progress:
                table = boot.peers.peers
                rounds = [table[p.name].round if p.name in table else 0 for p in placements]
                progress("deploy", min(rounds) if pending else recipe.rounds, recipe.rounds)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.5)
        for name in pending:  # stopped: every node leaves the mesh, then its records come back, all together
            actors[name].stop.remote()
        ended = await asyncio.gather(*(asyncio.to_thread(collect, ray, ref, out, STOP_WAIT)
                                       for ref in pending.values()), return_exceptions=True)
        for name, result in zip(pending, ended, strict=True):
            if isinstance(result, BaseException):
                failed[name] = f"did not stop within {STOP_WAIT:.0f} s of being asked"
            else:
                failed[name] = result or "stopped before the end (Ctrl-C)"
    finally:
        for actor in actors.values():
            ray.kill(actor, no_restart=True)
        await boot.stop()
        with contextlib.suppress(OSError):
            (out / TOKEN).unlink()
    return failed
