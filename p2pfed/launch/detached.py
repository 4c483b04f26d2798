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
import tempfile
import time
from pathlib import Path
from typing import Any

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


def check_name(name: str) -> str:
    """A deployment's name: what a node's name may be (letters, digits, '-', '_', '.')."""
    if not is_name(name):
        raise ConfigError(f"--name {clip(name, 40)}: a deployment's name is up to 64 letters, digits, '-', '_' or '.'")
    return name


class Supervisor:
    """A detached deployment's bootstrap, and the keeper of its nodes: a Ray actor on the machine `p2pfed deploy`
    ran on, using no CPU Ray counts."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.boot: Endpoint | None = None
        self.watching: asyncio.Task[None] | None = None
        self.seen: set[str] = set()  # nodes whose actor Ray has named
        self.lost: dict[str, str] = {}  # node -> why Ray cannot run it any more (its process died past its restarts)
        self.trouble: dict[str, str] = {}  # node -> why its last ask went unanswered (a process restarting)

    async def start(self) -> str:
        """Start the bootstrap and the watch over the nodes unless they run (a restarted supervisor is started again
        by the next status or stop); return the bootstrap's ticket."""
        if self.boot is None:
            from p2pfed.methods import load_checked

            spec = self.spec
            private = Path(tempfile.gettempdir()) / f"p2pfed-ray-{spec['token']}"
            private.mkdir(mode=0o700, exist_ok=True)
            recipe = private / "recipe.toml"
            recipe.write_text(spec["recipe_text"])
            host = LOOPBACK if spec["loopback"] else require_ray().util.get_node_ip_address()
            cfg = NodeConfig(name="bootstrap", bind=f"tcp://{host}:{spec['port']}")
            use_scenario_mesh(cfg, load_checked(recipe))
            cfg.mesh.mesh, cfg.mesh.insecure = spec["mesh"], spec["insecure"]
            boot = make_endpoint(cfg, "bootstrap")
            await boot.start(cfg.bind)
            self.boot = boot
        if self.watching is None or self.watching.done():
            self.watching = asyncio.ensure_future(self.watch())
        return self.boot.ticket

    async def watch(self) -> None:
        """Every WATCH_EVERY seconds, ask each node to run (OwnNode.start: a no-op for a node running or ended, a new
        beginning for one whose process Ray restarted). A node whose actor Ray no longer knows, once seen, is lost:
        its process died past its restarts."""
        ray = require_ray()
        while True:
            for node in self.spec["nodes"]:
                name = node["name"]
                if name in self.lost:
                    continue
                try:
                    actor = ray.get_actor(node_name(self.spec["name"], name), namespace=NAMESPACE)
                except ValueError:  # not created yet, or gone
                    if name in self.seen:
                        self.lost[name] = (f"its process died and Ray restarted it no more (--restarts "
                                           f"{self.spec['restarts']})")
                    continue
                self.seen.add(name)
                try:
                    if await asyncio.wait_for(actor.start.remote(), ASK_WAIT):
                        log.info("%s began (again)", name)
                    self.trouble.pop(name, None)
                except Exception as exc:  # restarting, or dying: asked again next time
                    self.trouble[name] = why_failed(exc) if not isinstance(exc, TimeoutError) else \
                        f"no answer within {ASK_WAIT:.0f} s"
            await asyncio.sleep(WATCH_EVERY)

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
        """Stop watching, stop the bootstrap, and take the token out of the deploy folder where it is seen here."""
        if self.watching is not None:
            self.watching.cancel()
        if self.boot is not None:
            await self.boot.stop()
        with contextlib.suppress(OSError):
            token = Path(self.spec["out"]) / TOKEN
            if token.read_text() == self.spec["token"]:
                token.unlink()


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
            "rounds": recipe.rounds, "restarts": config.restarts,
            "created": time.time(), "nodes": [{"name": p.name, "host": p.host, "data": p.data} for p in placements]}
    here = cluster[ray.util.get_node_ip_address()]
    try:
        supervisor = ray.remote(Supervisor).options(
            name=supervisor_name(name), namespace=NAMESPACE, lifetime="detached", num_cpus=0, max_restarts=-1,
            max_concurrency=8, scheduling_strategy=NodeAffinitySchedulingStrategy(here, soft=False)).remote(spec)
    except ValueError:
        with contextlib.suppress(OSError):
            (out / TOKEN).unlink()
        raise ConfigError(taken(name)) from None
    actors: dict[str, Any] = {"": supervisor}
    try:
        ticket = await asyncio.wait_for(supervisor.start.remote(), PLACE_WAIT)
        nodes: dict[str, Any] = {}
        for p in placements:
            options = {**actor_options(config, NodeAffinitySchedulingStrategy(cluster[p.host], soft=False)),
                       "name": node_name(name, p.name), "namespace": NAMESPACE, "lifetime": "detached",
                       "max_task_retries": 0}
            nodes[p.name] = actors[p.name] = ray.remote(OwnNode).options(**options).remote(
                node_spec(p, recipe_path, method, out, token, ticket, mesh, insecure, len(placements),
                          host == LOOPBACK))
        await await_placed(ray, nodes, placements, config)
        await asyncio.gather(*(actor.start.remote() for actor in nodes.values()))
    except BaseException:  # nothing half-deployed is left behind
        for actor in actors.values():
            with contextlib.suppress(Exception):
                ray.kill(actor, no_restart=True)
        with contextlib.suppress(OSError):
            (out / TOKEN).unlink()
        raise
    return str(ticket)


def taken(name: str) -> str:
    """Why a deployment may not take name."""
    return (f"a deployment named {name} runs on this Ray cluster already: stop it first (p2pfed deployment stop "
            f"{name}) or give this one another --name")


def deployments() -> list[str]:
    """The names of the deployments on the connected cluster."""
    ray = require_ray()
    named = ray.util.list_named_actors(all_namespaces=True)
    return sorted(a["name"].removesuffix("/" + SUPERVISOR) for a in named
                  if a.get("namespace") == NAMESPACE and a["name"].endswith("/" + SUPERVISOR))


def supervisor_of(name: str) -> Any:
    """The supervisor of deployment name; ConfigError naming the cluster's deployments if there is none."""
    ray = require_ray()
    try:
        return ray.get_actor(supervisor_name(check_name(name)), namespace=NAMESPACE)
    except ValueError:
        known = deployments()
        raise ConfigError(f"no deployment named {name} on this Ray cluster ("
                          + (f"its deployments: {', '.join(known)}" if known else "it has none") + ")") from None


async def status(name: str) -> dict[str, Any]:
    """Deployment name as its supervisor describes it, with each node's own state (OwnNode.state; "gone" for a
    node Ray runs no more)."""
    ray = require_ray()
    supervisor = supervisor_of(name)
    await asyncio.wait_for(supervisor.start.remote(), ASK_WAIT)  # a supervisor Ray restarted begins again
    described = await asyncio.wait_for(supervisor.describe.remote(), ASK_WAIT)
    states: dict[str, dict[str, Any]] = {}
    for node in described["nodes"]:
        node_ = node["name"]
        if node_ in described["lost"]:
            states[node_] = {"state": "gone", "why": described["lost"][node_]}
            continue
        try:
            actor = ray.get_actor(node_name(name, node_), namespace=NAMESPACE)
            states[node_] = await asyncio.wait_for(actor.state.remote(), ASK_WAIT)
        except ValueError:
            states[node_] = {"state": "gone", "why": "Ray runs no such actor"}
        except TimeoutError:
            states[node_] = {"state": "not answering", "why": f"no answer within {ASK_WAIT:.0f} s (restarting?)"}
        except Exception as exc:  # its process died past its restarts
            states[node_] = {"state": "gone", "why": why_failed(exc)}
    return {**described, "states": states}


async def stop(name: str, out: Path | None = None) -> tuple[dict[str, Any], dict[str, str]]:
    """Stop deployment name: every node that still runs leaves the mesh, the records of those that could not write
    to the deploy folder are written there (or to out), then every actor ends. Return the deployment as described
    and each node that did not finish with why."""
    ray = require_ray()
    supervisor = supervisor_of(name)
    with contextlib.suppress(Exception):  # a supervisor that cannot answer is stopped all the same
        await asyncio.wait_for(supervisor.start.remote(), ASK_WAIT)
    described = await asyncio.wait_for(supervisor.describe.remote(), ASK_WAIT)
    folder = out or Path(described["out"])
    folder.mkdir(parents=True, exist_ok=True)
    failed: dict[str, str] = {}
    actors: dict[str, Any] = {}
    for node in described["nodes"]:
        with contextlib.suppress(ValueError):
            actors[node["name"]] = ray.get_actor(node_name(name, node["name"]), namespace=NAMESPACE)
    for node in described["nodes"]:
        if node["name"] not in actors:
            failed[node["name"]] = described["lost"].get(node["name"], "Ray runs no such actor")

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

    try:
        await asyncio.gather(*(finish(node, actor) for node, actor in actors.items()))
        with contextlib.suppress(Exception):
            await asyncio.wait_for(supervisor.close.remote(), ASK_WAIT)
    finally:
        for actor in [*actors.values(), supervisor]:
            with contextlib.suppress(Exception):
                ray.kill(actor, no_restart=True)
    return described, failed
