"""A deployment that outlives its command: `p2pfed deploy --detach`, then `p2pfed deployment status|stop`.

`p2pfed deploy` without --detach runs the bootstrap in its own process and the nodes as long as it runs. With
--detach the same nodes are Ray's detached actors, named after the deployment, and the bootstrap runs in one more
detached actor, the deployment's supervisor, on the machine the command ran on. The command returns once every
node's process is placed and has begun; the mesh then lives as long as the Ray cluster or until `p2pfed deployment
stop NAME`, from any machine of the cluster.

A detached actor's run is not a call someone waits on (the caller is gone): each node runs its node in its own
actor's loop (OwnNode.start), and the supervisor asks every node to start again every WATCH_EVERY seconds. That is
what brings back a node whose process died: Ray restarts the process (up to --restarts times), the supervisor's
next ask begins the node again, and it resumes from its checkpoint. The supervisor also answers `status` (each
node's machine, round and state) and `stop` gathers the records of the nodes that could not write to the deploy
folder, as the attached command does at its end.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from p2pfed.config import ConfigError, NodeConfig
from p2pfed.launch.deploy import OwnNode, Placement, await_placed, cluster_of, node_spec
from p2pfed.launch.member import make_endpoint, use_scenario_mesh
from p2pfed.launch.ray_engine import (
    LOOPBACK,
    PLACE_WAIT,
    STOP_WAIT,
    TOKEN,
    actor_options,
    bind_host,
    require_ray,
    why_failed,
    write_back,
)
from p2pfed.net.endpoint import Endpoint
from p2pfed.scenario.config import RayConfig
from p2pfed.wire.messages import clip, is_name

log = logging.getLogger(__name__)

NAMESPACE = "p2pfed"  # the Ray namespace of every deployment's actors: any driver of the cluster finds them by name
SUPERVISOR = "supervisor"
WATCH_EVERY = 5.0  # seconds between a supervisor's asks that every node run (a restarted process begins again)
ASK_WAIT = 30.0  # seconds a supervisor, status or stop waits for one actor's answer


def supervisor_name(deployment: str) -> str:
    """The Ray name of a deployment's supervisor ('/' is in no node's or deployment's name)."""
    return f"{deployment}/{SUPERVISOR}"


def node_name(deployment: str, node: str) -> str:
    """The Ray name of a deployment's node."""
    return f"{deployment}/node/{node}"


def check_name(name: str, given: str = "--name") -> str:
    """A deployment's name (given by the option or argument given): what a node's name may be."""
    if not is_name(name):
        raise ConfigError(f"{given} {clip(name, 40)!r}: a deployment's name is up to 64 letters, digits, '-', '_' "
                          "or '.'")
    return name


async def ask(ref: Any, what: str, timeout: float = ASK_WAIT) -> Any:
    """The answer to an actor call, or a one-line ConfigError saying that what did not answer, and why."""
    try:
        return await asyncio.wait_for(ref, timeout)
    except TimeoutError:
        raise ConfigError(f"{what} did not answer within {timeout:.0f} s") from None
    except Exception as exc:  # Ray's errors carry the actor's traceback: one line of it
        raise ConfigError(f"{what} failed: {why_failed(exc)}") from None


class Supervisor:
    """A detached deployment's bootstrap, and the keeper of its nodes: a Ray actor on the machine `p2pfed deploy`
    ran on, using no CPU Ray counts. It logs to supervisor.log in the deploy folder."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.boot: Endpoint | None = None
        self.watching: asyncio.Task[None] | None = None
        self.starting = asyncio.Lock()
        self.seen: set[str] = set()  # nodes whose actor Ray has named
        self.running: set[str] = set()  # nodes found begun by an ask
        self.lost: dict[str, str] = {}  # node -> why Ray cannot run it any more (its process died past its restarts)
        self.trouble: dict[str, str] = {}  # node -> why its last ask went unanswered (a process restarting)
        # beside the nodes' private folders, not among them (a node may be named "supervisor")
        self.private = Path(tempfile.gettempdir()) / f"p2pfed-ray-{spec['token']}-{SUPERVISOR}"

    async def start(self) -> str:
        """Start the bootstrap and the watch over the nodes unless they run (a restarted supervisor is started again
        by the next status or stop, its bootstrap on the port it had: the nodes' tickets name it); return the
        bootstrap's ticket."""
        async with self.starting:
            if self.boot is None:
                self.boot = await self._bootstrap()
            if self.watching is None or self.watching.done():
                self.watching = asyncio.ensure_future(self.watch())
            return self.boot.ticket

    async def _bootstrap(self) -> Endpoint:
        from p2pfed.methods import load_checked

        spec = self.spec
        self.private.mkdir(mode=0o700, exist_ok=True)
        out = Path(spec["out"])
        with contextlib.suppress(OSError):
            if (out / TOKEN).read_text() == spec["token"]:  # the deploy folder is seen here: the log goes there
                handler = logging.FileHandler(out / "supervisor.log")
                handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s"))
                logging.getLogger().addHandler(handler)
                logging.getLogger().setLevel(logging.INFO)
        recipe = self.private / "recipe.toml"
        recipe.write_text(spec["recipe_text"])
        port_file = self.private / "bootstrap.port"
        port = int(port_file.read_text()) if port_file.exists() else spec["port"]
        host = LOOPBACK if spec["loopback"] else require_ray().util.get_node_ip_address()
        cfg = NodeConfig(name="bootstrap", bind=f"tcp://{host}:{port}")
        use_scenario_mesh(cfg, load_checked(recipe))
        cfg.mesh.mesh, cfg.mesh.insecure = spec["mesh"], spec["insecure"]
        boot = make_endpoint(cfg, "bootstrap")
        await boot.start(cfg.bind)
        port_file.write_text(str(urlparse(boot.ticket).port))
        log.info("deployment %s: bootstrap %s", spec["name"], boot.ticket)
        return boot

    async def watch(self) -> None:
        """Every WATCH_EVERY seconds, ask each node to run (OwnNode.start: a no-op for a node running or ended, a new
        beginning for one whose process Ray restarted), all at once. A node whose actor Ray no longer knows, once
        seen, is lost: its process died past its restarts. Nothing ends the watch but close."""
        while True:
            await asyncio.gather(*(self._keep(node["name"]) for node in self.spec["nodes"] if node["name"]
                                   not in self.lost))
            await asyncio.sleep(WATCH_EVERY)

    async def _keep(self, name: str) -> None:
        ray = require_ray()
        try:
            try:
                actor = ray.get_actor(node_name(self.spec["name"], name), namespace=NAMESPACE)
            except ValueError:  # not created yet, or gone
                if name in self.seen:
                    self.lost[name] = ("its process died and Ray restarted it no more (--restarts "
                                       f"{self.spec['restarts']})")
                    log.warning("%s: %s", name, self.lost[name])
                return
            self.seen.add(name)
            if not await asyncio.wait_for(actor.start.remote(), ASK_WAIT):
                self.running.add(name)  # begun already (by the deploy, or by an earlier ask)
            elif name in self.running:  # it ran, and now began anew: its process was restarted
                log.info("%s began again (its process was restarted)", name)
            self.trouble.pop(name, None)
        except TimeoutError:
            self.trouble[name] = f"no answer within {ASK_WAIT:.0f} s"
        except Exception as exc:  # restarting, dying, or Ray's control store out of reach: asked again next time
            self.trouble[name] = why_failed(exc)
            log.info("%s: %s", name, self.trouble[name])

    async def describe(self) -> dict[str, Any]:
        """The deployment as it was deployed (spec, less the recipe's text) and each node's round as the bootstrap
        hears it (node_rounds)."""
        table = self.boot.peers.peers if self.boot is not None else {}
        node_rounds = {n["name"]: table[n["name"]].round for n in self.spec["nodes"] if n["name"] in table}
        heard = {n["name"]: table[n["name"]].state for n in self.spec["nodes"] if n["name"] in table}
        spec = {k: v for k, v in self.spec.items() if k != "recipe_text"}
        return {**spec, "node_rounds": node_rounds, "heard": heard, "lost": dict(self.lost),
                "trouble": dict(self.trouble), "ticket": self.boot.ticket if self.boot is not None else ""}

    async def close(self) -> None:
        """Stop watching (no node is begun again), stop the bootstrap, and remove this supervisor's private files
        (stop takes the token out of the deploy folder once the nodes have ended: they read where to write by it)."""
        if self.watching is not None:
            self.watching.cancel()
            self.watching = None
        if self.boot is not None:
            await self.boot.stop()
        with contextlib.suppress(OSError):
            shutil.rmtree(self.private)


def remove_token(out: Path, token: str) -> None:
    """Take a deployment's token out of its deploy folder, if it is there and still the deployment's."""
    with contextlib.suppress(OSError):
        if (out / TOKEN).read_text() == token:
            (out / TOKEN).unlink()


async def deploy_detached(recipe_path: Path, placements: list[Placement], out: Path, *, name: str, method: str,
                          mesh: str, insecure: bool, config: RayConfig, port: int = 0) -> str:
    """Start a detached deployment: its supervisor (the bootstrap) on this machine, each placement's node on its
    machine, every process placed and its node begun; return the bootstrap's ticket. Ray must be connected to a
    cluster that outlives this process, and check_deploy have passed."""
    ray = require_ray()
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from p2pfed.methods import load_checked

    recipe = load_checked(recipe_path)
    cluster = cluster_of(ray, placements)
    if name in deployments():  # before its folder is touched: it may be this one's too
        raise ConfigError(taken(name))
    host = bind_host(ray)
    token = secrets.token_hex(16)
    out.mkdir(parents=True, exist_ok=True)
    (out / TOKEN).write_text(token)
    insecure = insecure or recipe.mesh.insecure
    spec = {"name": name, "out": str(out.resolve()), "token": token, "recipe_text": recipe_path.read_text(),
            "method": method, "mesh": mesh, "insecure": insecure, "loopback": host == LOOPBACK, "port": port,
            "rounds": recipe.rounds, "restarts": config.restarts, "created": time.time(),
            "nodes": [{"name": p.name, "host": p.host} for p in placements]}
    here = ray.get_runtime_context().get_node_id()  # this machine, however many addresses it has
    actors: dict[str, Any] = {}
    try:
        actors[""] = ray.remote(Supervisor).options(
            name=supervisor_name(name), namespace=NAMESPACE, lifetime="detached", num_cpus=0, max_restarts=-1,
            max_concurrency=8, scheduling_strategy=NodeAffinitySchedulingStrategy(here, soft=False)).remote(spec)
        ticket = await ask(actors[""].start.remote(), f"the supervisor of deployment {name}", PLACE_WAIT)
        nodes: dict[str, Any] = {}
        for p in placements:
            options = {**actor_options(config, NodeAffinitySchedulingStrategy(cluster[p.host], soft=False)),
                       "name": node_name(name, p.name), "namespace": NAMESPACE, "lifetime": "detached",
                       "max_task_retries": 0}
            nodes[p.name] = actors[p.name] = ray.remote(OwnNode).options(**options).remote(
                node_spec(p, recipe_path, method, out, token, ticket, mesh, insecure, len(placements),
                          host == LOOPBACK))
        await await_placed(ray, nodes, placements, config)
        for node, actor in nodes.items():
            await ask(actor.start.remote(), f"node {node}")
    except BaseException as exc:  # nothing half-deployed is left behind
        for actor in actors.values():
            with contextlib.suppress(Exception):
                ray.kill(actor, no_restart=True)
        remove_token(out, token)
        if isinstance(exc, ValueError) and not actors:  # Ray's word that the name was taken meanwhile
            raise ConfigError(taken(name)) from None
        raise
    return str(ticket)


def taken(name: str) -> str:
    """Why a deployment may not take name."""
    return (f"a deployment named {name} runs on this Ray cluster already: stop it first (p2pfed deployment stop "
            f"{name}) or give this one another --name")


def _named() -> list[str]:
    """The names of the actors of every deployment on the connected cluster."""
    named = require_ray().util.list_named_actors(all_namespaces=True)
    return [a["name"] for a in named if a.get("namespace") == NAMESPACE]


def deployments() -> list[str]:
    """The names of the deployments on the connected cluster: those with a supervisor, and those whose supervisor
    is gone but whose nodes run on."""
    found = set()
    for actor in _named():
        parts = actor.split("/")
        if parts[1:] == [SUPERVISOR] or (len(parts) == 3 and parts[1] == "node"):
            found.add(parts[0])
    return sorted(found)


def _nodes_of(name: str) -> dict[str, Any]:
    """The node actors of deployment name that Ray knows, by node."""
    ray = require_ray()
    prefix = node_name(name, "")
    actors = {}
    for actor in _named():
        if actor.startswith(prefix):
            with contextlib.suppress(ValueError):  # gone meanwhile
                actors[actor.removeprefix(prefix)] = ray.get_actor(actor, namespace=NAMESPACE)
    return actors


async def _described(name: str) -> tuple[Any, dict[str, Any]]:
    """Deployment name's supervisor (None if it is gone or does not answer) and the deployment as it describes
    it, or, without it, as its nodes do (their machines and deploy folder: no rounds, no ticket). ConfigError
    naming the cluster's deployments if there is no such deployment."""
    ray = require_ray()
    supervisor = None
    with contextlib.suppress(ValueError):
        supervisor = ray.get_actor(supervisor_name(check_name(name, "deployment")), namespace=NAMESPACE)
    if supervisor is not None:
        try:
            await ask(supervisor.start.remote(), f"the supervisor of deployment {name}")  # one Ray restarted begins
            return supervisor, await ask(supervisor.describe.remote(), f"the supervisor of deployment {name}")
        except ConfigError as exc:
            log.warning("%s; asking its nodes instead", exc)
    nodes = _nodes_of(name)
    if not nodes:
        known = deployments()
        raise ConfigError(f"no deployment named {name} on this Ray cluster ("
                          + (f"its deployments: {', '.join(known)}" if known else "it has none") + ")")
    names = sorted(nodes)
    answers = await asyncio.gather(*(ask(nodes[n].placement.remote(), f"node {n}") for n in names),
                                   return_exceptions=True)
    placed = {n: a for n, a in zip(names, answers, strict=True) if isinstance(a, dict)}
    trouble = {n: str(a) for n, a in zip(names, answers, strict=True) if not isinstance(a, dict)}
    log.warning("deployment %s has no supervisor that answers: its nodes say where they are; none is begun again "
                "if its process dies", name)
    said = next(iter(placed.values()), {"out": "", "token": ""})
    return supervisor, {"name": name, "nodes": [{"name": n, "host": placed.get(n, {}).get("host", "?")} for n in names],
                        "out": said["out"], "token": said["token"], "method": "", "rounds": "", "ticket": "",
                        "node_rounds": {}, "heard": {}, "lost": {}, "trouble": trouble}


async def status(name: str) -> dict[str, Any]:
    """Deployment name as its supervisor describes it, with each node's own state (OwnNode.state; "gone" for a
    node Ray runs no more, "restarting" for one whose process Ray is starting again)."""
    ray = require_ray()
    _, described = await _described(name)
    nodes = _nodes_of(name)

    async def state(node: str) -> dict[str, Any]:
        if node in described["lost"]:
            return {"state": "gone", "why": described["lost"][node]}
        if node not in nodes:
            return {"state": "gone", "why": "Ray runs no such actor"}
        try:
            return dict(await asyncio.wait_for(nodes[node].state.remote(), ASK_WAIT))
        except TimeoutError:
            return {"state": "not answering", "why": f"no answer within {ASK_WAIT:.0f} s"}
        except ray.exceptions.ActorUnavailableError:
            return {"state": "restarting", "why": "Ray is starting its process again"}
        except Exception as exc:  # its process died past its restarts
            return {"state": "gone", "why": why_failed(exc)}

    names = [n["name"] for n in described["nodes"]]
    states = await asyncio.gather(*(state(node) for node in names))
    return {**described, "states": dict(zip(names, states, strict=True))}


async def stop(name: str, out: Path | None = None) -> tuple[dict[str, Any], dict[str, str], dict[str, Any]]:
    """Stop deployment name: the supervisor first (no node is begun again), then every node that still runs leaves
    the mesh, the records of those that could not write to the deploy folder are written there (or to out), and
    every actor ends. Return the deployment as described, each node that did not finish with why, and each node's
    final accuracy and chosen peers (those that finished)."""
    ray = require_ray()
    supervisor, described = await _described(name)
    if not out and not described["out"]:
        raise ConfigError(f"no node of deployment {name} says where its deploy folder is: give --out")
    folder = out or Path(described["out"])
    folder.mkdir(parents=True, exist_ok=True)
    nodes = _nodes_of(name)
    failed = {n["name"]: described["lost"].get(n["name"], "Ray runs no such actor")
              for n in described["nodes"] if n["name"] not in nodes}
    finals: dict[str, Any] = {}

    async def finish(node: str, actor: Any) -> None:
        try:
            result = await asyncio.wait_for(actor.finish.remote(), STOP_WAIT)
        except TimeoutError:
            failed[node] = f"did not stop within {STOP_WAIT:.0f} s of being asked"
            return
        except Exception as exc:  # its process died past its restarts
            failed[node] = described["lost"].get(node) or why_failed(exc)
            return
        error = write_back(result, folder)
        if error or result.get("cut_short"):
            failed[node] = error or "stopped before the end (p2pfed deployment stop)"
        elif result.get("final"):
            finals[node] = result["final"]

    try:
        if supervisor is not None:
            with contextlib.suppress(Exception):  # one that cannot close is ended below all the same
                await asyncio.wait_for(supervisor.close.remote(), ASK_WAIT)
        await asyncio.gather(*(finish(node, actor) for node, actor in nodes.items()))
    finally:
        for actor in [*nodes.values(), *([supervisor] if supervisor is not None else [])]:
            with contextlib.suppress(Exception):
                ray.kill(actor, no_restart=True)
        if described["token"]:
            remove_token(Path(described["out"]), described["token"])
    return described, failed, finals
