"""Run one member of a mesh (bootstrap, node or coordinator) from its configuration until told to stop."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import socket
import zlib
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING

from p2pfed.config import NodeConfig
from p2pfed.net import security
from p2pfed.net.discovery import MqttDiscovery
from p2pfed.net.endpoint import Endpoint
from p2pfed.net.waits import unless_stopped

if TYPE_CHECKING:
    from p2pfed.learn.datasets import Dataset
    from p2pfed.scenario.config import Scenario

log = logging.getLogger(__name__)

JOIN_WAIT = 60.0  # seconds a learning node or coordinator waits to be welcomed before giving up
# and, for a scenario's nodes, this much longer for each other node of the scenario: all of them join one
# bootstrap at once, and it welcomes 1,000 over minutes, not within one
JOIN_WAIT_PER_NODE = 0.5


def own_index(name: str) -> int:
    """The number a node with its own data (no index into a shared dataset) seeds its training with: the same
    for the same name on every machine and run, different for different names."""
    return zlib.crc32(name.encode()) % 1_000_003


def any_port(bind: str) -> str:
    """The address bind names with the port left to the system: tcp://HOST:PORT -> tcp://HOST:0."""
    host = bind[len("tcp://"):].rsplit(":", 1)[0] if bind.startswith("tcp://") else "127.0.0.1"
    return f"tcp://{host}:0"


def use_scenario_mesh(cfg: NodeConfig, scenario: Scenario, method: str | None = None) -> None:
    """Take the scenario's mesh settings (timing, message size cap): every member of a scenario's mesh must
    agree on them. The mesh name stays the one given (--mesh, "default"), as a bootstrap started without a
    scenario has it: members of other methods or scenarios are told apart by their recipe's fingerprint. A
    member of a scenario's node run by method introduces itself as the method takes it in a mesh of the scenario's
    nodes (methods.introduce_up_to); without a method (a bootstrap, a coordinator, an own-data node), to every
    peer unless the scenario says otherwise."""
    from p2pfed.methods import introduce_up_to, introduce_warning

    insecure = cfg.mesh.insecure or scenario.mesh.insecure  # asked for on the command line, or by the scenario
    cfg.mesh = dataclasses.replace(scenario.mesh, mesh=cfg.mesh.mesh, insecure=insecure)
    if method is not None:
        cfg.mesh.introduce_up_to = introduce_up_to(method, scenario)
        if cut_short := introduce_warning(method, scenario):
            log.warning("%s", cut_short)


def make_endpoint(cfg: NodeConfig, role: str, recipe: str = "") -> Endpoint:
    """Build (not start) the endpoint a configuration describes, advertising recipe."""
    name = cfg.name or ("bootstrap" if role == "bootstrap" else socket.gethostname())
    keys = None
    if not cfg.mesh.insecure:  # the default: this member's own key pair, made on its first start
        keys = security.member_keys(Path(cfg.keys).expanduser() if cfg.keys else security.default_key_home(), name)
    options, transport = cfg.mesh.endpoint_options()
    return Endpoint(name, role, options=options, keys=keys, join_key=cfg.join_key or None,
                    transport_options=transport, recipe=recipe)


async def run_member(
    cfg: NodeConfig,
    role: str,
    stop: asyncio.Event,
) -> None:
    """Start the member, join, and run until stop is set, then leave cleanly."""
    endpoint = make_endpoint(cfg, role)
    discovery = None
    await endpoint.start(cfg.bind, cfg.join, cfg.advertise or None)
    try:
        if cfg.discovery:
            discovery = MqttDiscovery(endpoint, cfg.discovery)
            discovery.start()
        # Until told to stop; a join that fails (refused, or no answer for join_give_up seconds) ends it.
        await unless_stopped(stop, endpoint.wait_joined(math.inf))
        await stop.wait()
    finally:
        if discovery is not None:
            await discovery.stop()
        await endpoint.stop()
        log.info("%s: stopped", endpoint.name)


async def run_learning_nodes(cfg: NodeConfig, scenario_path: Path, indices: list[int], method: str | None,
                             out: Path, stop: asyncio.Event, *, start_round: int = 0, wait_for: int = 0,
                             send_delay: float = 0.0, coordinator: str | None = None) -> None:
    """Run the learning nodes of a scenario with these indices in this process (each with its own sockets),
    deriving their shards from the shared scenario file, until they finish or stop is set.

    A coordinated method (or no method and a coordinator to follow) makes them CentralNodes that answer the
    coordinator's tasks; a decentralized method makes them LearningNodes that run their own rounds."""
    import torch

    from p2pfed.launch.adversary import conduct_of
    from p2pfed.launch.runner import make_node, prepare_data, recipe_of, scenario_node
    from p2pfed.methods import check_method, load_checked

    scenario = load_checked(scenario_path)
    bad = [i for i in indices if not 0 <= i < scenario.nodes]
    if bad:
        raise ValueError(f"--index {bad[0]} is outside the scenario's {scenario.nodes} nodes")
    if method is None and coordinator is None:
        raise ValueError("a node needs --method, or --coordinator to take its method from")
    if method is not None:
        check_method(method, scenario)
    use_scenario_mesh(cfg, scenario, method)
    torch.set_num_threads(1)
    dataset, partition = prepare_data(scenario)
    out.mkdir(parents=True, exist_ok=True)
    nodes, endpoints = [], []
    try:
        for index in indices:
            cfg.name = scenario.node_name(index)
            endpoint = make_endpoint(cfg, "node", recipe_of(scenario, method, dataset))
            endpoints.append(endpoint)
            # a group's nodes each take a port of their own on the host asked for (a port, or an address to
            # advertise, given is one node's: the others' addresses are told by their sockets)
            alone = len(indices) == 1
            await endpoint.start(cfg.bind if alone else any_port(cfg.bind), cfg.join,
                                 (cfg.advertise if alone else "") or None)
            node = make_node(scenario, scenario_node(scenario, index, dataset, partition), method, endpoint, out,
                             coordinator=coordinator, conduct=conduct_of(scenario, index))
            node.send_delay = send_delay
            nodes.append(node)
        wait = JOIN_WAIT + JOIN_WAIT_PER_NODE * (scenario.nodes - 1)
        if not await unless_stopped(stop, asyncio.gather(*(e.wait_joined(wait) for e in endpoints))):
            return  # stopped while joining
        runs = [asyncio.ensure_future(n.run(start_round, wait_for_peers=wait_for)) for n in nodes]
        try:
            await unless_stopped(stop, asyncio.gather(*runs))  # raises the first node's failure
        finally:
            for task in runs:  # the other nodes of this process stop with it
                task.cancel()
    finally:
        # together: one after the other, a process of 25 nodes spent a dozen seconds on its goodbyes
        stopped = await asyncio.gather(*(endpoint.stop() for endpoint in endpoints), return_exceptions=True)
        failed = next((r for r in stopped if isinstance(r, BaseException)), None)
        if failed is not None:
            raise failed


async def run_own_node(cfg: NodeConfig, recipe_path: Path, data_path: Path, method: str | None, out: Path,
                       stop: asyncio.Event, *, coordinator: str | None = None, wait_for: int = 0) -> None:
    """Run a node that trains on this machine's own data (data_path, learn/own.py) under the mesh's recipe (a
    scenario file fixing model, method and training; its data partition is not used), until it finishes or
    stop is set. Its method: method, else the coordinator's, else the recipe's first. Its data is checked
    against the recipe before it joins; only models ever leave it."""

    from p2pfed.launch.runner import capped, make_node, recipe_of
    from p2pfed.learn.datasets import is_text, load_dataset
    from p2pfed.learn.own import Split, expected_shape, load_own_data, load_own_text
    from p2pfed.learn.text import vocabulary_of
    from p2pfed.methods import check_method, load_checked
    from p2pfed.node.local import LocalData, NodeData

    recipe = load_checked(recipe_path)
    if method is None and coordinator is None:
        method = recipe.methods[0]  # the recipe's (first) method
    if method is not None:
        check_method(method, recipe)
    name = cfg.name or socket.gethostname()
    split = Split(recipe.data.val_fraction, recipe.data.test_fraction)
    seed = recipe.seed + own_index(name)
    if recipe.data.vocabulary or is_text(recipe.data.dataset):  # next-token prediction on its own words
        n = recipe.data.words_per_sample  # a sequence's words are joined by spaces: a letter of its vocabulary
        vocabulary = (vocabulary_of(recipe.data.vocabulary + (" " if n > 1 else "")) if recipe.data.vocabulary
                      else load_dataset(recipe.data.dataset, recipe.data.root or None, recipe.seed, n).vocabulary)
        dataset, train, val, test = load_own_text(data_path, vocabulary, split, seed, n)
        shape, classes = dataset.input_shape, dataset.num_classes
    else:
        shape, classes = expected_shape(recipe.data.dataset, recipe.data.input_shape, recipe.data.classes)
        dataset, train, val, test = load_own_data(data_path, shape, classes, split, seed, recipe.data.class_names)
    check_model_takes(recipe.train.model, dataset, data_path)
    log.info("%s: own data %s: %d training, %d validation, %d test samples of %s, %d classes", name, data_path,
             len(train), len(val), len(test), shape, classes)
    # its splits as the recipe caps a scenario's shards (data.max_train, data.max_val); no true cluster: nobody
    # knows it
    train, val = capped(recipe, train, val)
    x, y = dataset.x_train, dataset.y_train
    splits = LocalData(x[train], y[train], x[val], y[val], dataset.x_test[test], dataset.y_test[test])
    # its mesh's size is not the recipe's nodes (a recipe's partition is not used): it introduces itself to every
    # peer unless the recipe's [mesh] says otherwise
    use_scenario_mesh(cfg, recipe)
    cfg.name = name
    out.mkdir(parents=True, exist_ok=True)

    async def learn(endpoint: Endpoint) -> None:
        node = make_node(recipe, NodeData(name, own_index(name), splits, dataset), method, endpoint, out,
                         coordinator=coordinator)
        await node.run(0, wait_for_peers=wait_for)

    await _joined(cfg, "node", recipe_of(recipe, method, dataset), stop, learn)


def check_model_takes(model: str, dataset: Dataset, where: Path) -> None:
    """Stop, before joining, if the recipe's model cannot take this data (e.g. a CNN given feature rows)."""
    import torch

    from p2pfed.learn.models import build_model
    from p2pfed.learn.own import OwnDataError

    try:
        with torch.no_grad():
            build_model(model, dataset.input_shape, dataset.num_classes)(dataset.x_train[:2])
    except (RuntimeError, ValueError) as exc:
        raise OwnDataError(f"{where}: the recipe's model {model!r} cannot take samples of shape "
                           f"{dataset.input_shape} ({str(exc).splitlines()[0][:150]}); for feature rows use "
                           "model = \"logreg\"") from None


async def _joined(cfg: NodeConfig, role: str, recipe: str, stop: asyncio.Event,
                  work: Callable[[Endpoint], Awaitable[None]]) -> None:
    """Start the member cfg describes (advertising recipe), join, run work(endpoint) until it ends or stop is
    set, and stop the member whatever happens."""
    endpoint = make_endpoint(cfg, role, recipe)
    await endpoint.start(cfg.bind, cfg.join, cfg.advertise or None)
    try:
        if await unless_stopped(stop, endpoint.wait_joined(JOIN_WAIT)):
            await unless_stopped(stop, work(endpoint))
    finally:
        await endpoint.stop()
        log.info("%s: stopped", endpoint.name)


async def run_coordinator(cfg: NodeConfig, scenario_path: Path, method: str, out: Path, stop: asyncio.Event, *,
                          wait_for: int = 0, state_dir: Path | None = None) -> None:
    """Run the coordinator of a coordinated method over the mesh cfg describes, until the run ends or stop
    is set. It may be the first member (nodes then join through it) or join an existing mesh."""
    import torch

    from p2pfed.launch.runner import make_coordinator, prepare_data, recipe_of
    from p2pfed.methods import CENTRAL, REGISTRY, check_method, is_central, load_checked

    if method in REGISTRY:
        raise ValueError(f"{method} is a decentralized method: its nodes need no coordinator")
    if not is_central(method):
        raise ValueError(f"unknown method {method!r}; a coordinator runs one of {', '.join(CENTRAL)}")
    scenario = load_checked(scenario_path)
    check_method(method, scenario)
    use_scenario_mesh(cfg, scenario)
    cfg.name = cfg.name or "coordinator"
    torch.set_num_threads(1)
    dataset, partition = prepare_data(scenario)

    async def coordinate(endpoint: Endpoint) -> None:
        await make_coordinator(scenario, method, endpoint, dataset, partition, out, state_dir).run(wait_for=wait_for)

    await _joined(cfg, "coordinator", recipe_of(scenario, method, dataset), stop, coordinate)
