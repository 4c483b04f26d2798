"""The p2pfed command line: bootstrap, node, coordinator, mesh status, keys, run, report, deploy, deployment,
dashboard, export, predict, convert.

Only this module prints; the library logs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tabulate import tabulate

from p2pfed.config import ConfigError, NodeConfig, load_node_config

if TYPE_CHECKING:
    from p2pfed.learn.export import ExportedModel


def _setup_logging(verbose: int) -> None:
    level = logging.DEBUG if verbose > 1 else logging.INFO if verbose else logging.WARNING
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)-7s %(name)s: %(message)s",
                        datefmt="%H:%M:%S", stream=sys.stderr)
    if verbose < 2:
        logging.getLogger("zmq.auth").setLevel(logging.WARNING)


def _run_until_signal(make: Any) -> int:
    """Run make(stop_event) on a fresh event loop; SIGINT/SIGTERM set the stop event."""

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await make(stop)

    asyncio.run(main())
    return 0


def _member_config(args: argparse.Namespace, section: str) -> NodeConfig:
    cfg = load_node_config(Path(args.config) if args.config else None, section)
    if args.bind:
        cfg.bind = args.bind
    if getattr(args, "join", None):
        cfg.join = list(args.join)
    for key in ("name", "advertise", "keys", "join_key", "discovery"):
        value = getattr(args, key, None)
        if value:
            setattr(cfg, key, value)
    if args.mesh:
        cfg.mesh.mesh = args.mesh
    if args.insecure:
        cfg.mesh.insecure = True
    if cfg.mesh.insecure and cfg.keys:
        raise ConfigError("--insecure and --keys exclude each other: keys are what --insecure leaves out")
    cfg.validate("")
    return cfg


def cmd_bootstrap(args: argparse.Namespace) -> int:
    """Start the rendezvous a mesh grows from."""
    from p2pfed.launch.member import run_member

    cfg = _member_config(args, "bootstrap")
    cfg.name = cfg.name or "bootstrap"
    return _run_until_signal(lambda stop: run_member(cfg, "bootstrap", stop))


def cmd_node(args: argparse.Namespace) -> int:
    """Start a node that joins a mesh."""
    from p2pfed.launch.member import run_member

    cfg = _member_config(args, "node")
    if args.coordinator and args.coordinator.startswith("tcp://"):
        from p2pfed.net.security import split_ticket

        ticket = args.coordinator
        args.coordinator, key = split_ticket(ticket)  # followed by its address; its ticket may carry its key
        if not cfg.join:
            cfg.join = [ticket]  # join the mesh through the coordinator itself
            if key is None and not args.join_key:
                cfg.join_key = "coordinator"  # a coordinator started on this machine: its key is in the key folder
    if not cfg.join and not cfg.discovery:
        raise ConfigError("a node needs --join tcp://HOST:PORT (a bootstrap or any live node) or --discovery")
    method = args.method or (None if args.coordinator else "pfedlia-p2p")
    if args.data:
        from p2pfed.launch.member import run_own_node

        if not args.scenario:
            raise ConfigError("--data needs --recipe FILE: the scenario file the mesh shares (model, method, "
                              "training), e.g. node/recipe.toml")
        if args.index is not None:
            raise ConfigError("--data and --index exclude each other: a node with its own data has no shard")
        return _run_until_signal(lambda stop: run_own_node(
            cfg, Path(args.scenario), Path(args.data), args.method, Path(args.out), stop, coordinator=args.coordinator,
            wait_for=args.wait_for))
    if args.scenario:
        from p2pfed.launch.member import run_learning_nodes

        indices = args.index or [0]
        return _run_until_signal(lambda stop: run_learning_nodes(
            cfg, Path(args.scenario), indices, method, Path(args.out), stop, start_round=args.start_round,
            wait_for=args.wait_for, send_delay=args.send_delay, coordinator=args.coordinator))
    return _run_until_signal(lambda stop: run_member(cfg, "node", stop))


def cmd_coordinator(args: argparse.Namespace) -> int:
    """Start the coordinator of a coordinated method."""
    from p2pfed.launch.member import run_coordinator

    cfg = _member_config(args, "node")
    return _run_until_signal(lambda stop: run_coordinator(
        cfg, Path(args.scenario), args.method, Path(args.out), stop, wait_for=args.wait_for,
        state_dir=Path(args.state) if args.state else None))


def cmd_deploy(args: argparse.Namespace) -> int:
    """Start nodes with their own data on the machines of a Ray cluster, and a bootstrap here; run until they end
    (or, with --detach, leave them running under a supervisor of the cluster's and return)."""
    import os
    import time

    from p2pfed.launch.deploy import check_deploy, deploy, parse_placement
    from p2pfed.launch.detached import check_name, deploy_detached
    from p2pfed.launch.ray_engine import ray_session

    placements = [parse_placement(text, Path.cwd()) for text in args.data]
    config = _deploy_ray_config(args)
    if not 0 <= args.port <= 65535:
        raise ConfigError(f"--port must be in 0..65535 (got {args.port})")
    if args.detach and not config.address and not os.environ.get("RAY_ADDRESS"):
        raise ConfigError("--detach leaves the nodes on a Ray cluster that outlives this command: give its --address "
                          "(HEAD:6379, started with `ray start --head`); without one the cluster is this command's "
                          "own and ends with it")
    if args.name and not args.detach:
        raise ConfigError("--name names a detached deployment: give --detach too")
    method = check_deploy(Path(args.recipe), placements, args.method, config)
    out = Path(args.out) if args.out else Path("runs") / f"deploy-{time.strftime('%Y%m%d-%H%M%S')}"
    if args.detach:
        name = check_name(args.name, "--name") if args.name else check_name(out.name, "the deploy folder's name")
        with ray_session(config, len(placements)):
            ticket = asyncio.run(deploy_detached(Path(args.recipe), placements, out, name=name, method=method,
                                                 mesh=args.mesh, insecure=args.insecure, config=config,
                                                 port=args.port))
        at = (f" --address {args.address}" if args.address else "") + (
            " --ray-unauthenticated" if args.ray_unauthenticated else "")
        print(f"deployment {name}: {len(placements)} nodes running on the Ray cluster, detached from this command\n"
              f"bootstrap ticket: {ticket} (more nodes may join with --join {ticket})\n"
              f"see it:  p2pfed deployment status {name}{at}\n"
              f"stop it: p2pfed deployment stop {name}{at} (records and logs: {out})")
        return 0

    def started(ticket: str) -> None:
        print(f"bootstrap ticket: {ticket} (more nodes may join with --join {ticket})", file=sys.stderr)

    with ray_session(config, len(placements)), ProgressBars(enabled=not args.quiet) as bars:
        failed: dict[str, str] = {}

        async def run(stop: asyncio.Event) -> None:
            failed.update(await deploy(Path(args.recipe), placements, out, stop, method=method, mesh=args.mesh,
                                       insecure=args.insecure, config=config, port=args.port,
                                       progress=bars.update, started=started))

        _run_until_signal(run)
    return _said_per_node(out, [(p.name, p.host) for p in placements], failed, "deploy folder")


def _deploy_ray_config(args: argparse.Namespace) -> Any:
    """The [ray] settings that deploy's and deployment's options give, checked."""
    from p2pfed.scenario.config import RayConfig

    config = RayConfig(address=args.address or "", cpus=getattr(args, "cpus", 1.0), gpus=getattr(args, "gpus", 0.0),
                       restarts=getattr(args, "restarts", 1), authenticated=not args.ray_unauthenticated)
    config.validate("--")
    return config


def _said_per_node(out: Path, nodes: list[tuple[str, str]], failed: dict[str, str], what: str,
                   finals: dict[str, Any] | None = None) -> int:
    """A line per node (its machine, final accuracy and chosen peers, or why it did not finish), the folder, and
    exit status 1 naming each node that did not finish. The finals are the folder's final records unless given."""
    from p2pfed.report.records import read_records

    if finals is None:
        finals = {r["node"]: r for r in read_records(out, containing='"final"')
                  if r.get("event") == "final" and "node" in r}
    for name, host in nodes:
        final = finals.get(name)
        said = (f"accuracy {100 * final['accuracy']:.2f} %, chose {', '.join(final.get('chosen') or []) or 'no one'}"
                if final else failed.get(name, "no final record"))
        print(f"{name:12s} on {host:15s} {said}")
    print(f"\n{what}: {out} (each node's records and log; its model stays on its machine)")
    return _failed([f"{name} did not finish: {why}" for name, why in failed.items()])


def cmd_deployment(args: argparse.Namespace) -> int:
    """Look at or stop a detached deployment (p2pfed deploy --detach) on a Ray cluster."""
    import os

    from p2pfed.launch import detached
    from p2pfed.launch.ray_engine import ray_session

    config = _deploy_ray_config(args)
    if not config.address and not os.environ.get("RAY_ADDRESS"):
        raise ConfigError("p2pfed deployment asks the Ray cluster the deployment runs on: give its --address "
                          "(HEAD:6379) or set RAY_ADDRESS")
    if args.action == "stop" and not args.name:
        raise ConfigError("p2pfed deployment stop NAME: which deployment (p2pfed deployment status lists them)")
    if args.name:
        detached.check_name(args.name, "deployment")
    with ray_session(config, 0):
        if args.action == "stop":
            described, failed, finals = asyncio.run(detached.stop(args.name, Path(args.out) if args.out else None))
            print(f"deployment {args.name} stopped")
            return _said_per_node(Path(args.out or described["out"]),
                                  [(n["name"], n["host"]) for n in described["nodes"]], failed, "deploy folder",
                                  finals)
        if not args.name:
            names = detached.deployments()
            print("\n".join(names) if names else "no deployments on this Ray cluster")
            return 0
        described = asyncio.run(detached.status(args.name))
    if described["method"]:
        print(f"deployment {args.name}: {described['method']} on {len(described['nodes'])} nodes, "
              f"{described['rounds']} rounds; bootstrap {described['ticket'] or 'not running'}; records and logs: "
              f"{described['out']}")
    else:  # told by its nodes
        print(f"deployment {args.name}: {len(described['nodes'])} nodes (no supervisor answers: method, rounds and "
              f"bootstrap unknown); records and logs: {described['out'] or 'unknown'}")
    rows = []
    for node in described["nodes"]:
        state = described["states"][node["name"]]
        said = state["state"]
        if state["state"] == "finished" and state.get("accuracy") is not None:
            said += f": accuracy {100 * state['accuracy']:.2f} %, chose {', '.join(state['chosen']) or 'no one'}"
        elif state.get("why"):
            said += f": {state['why']}"
        trouble = described["trouble"].get(node["name"])
        at = described["rounds"] if state["state"] == "finished" else described["node_rounds"].get(node["name"], "-")
        rows.append([node["name"], node["host"], at,
                     described["heard"].get(node["name"], "-"), said + (f" ({trouble})" if trouble else "")])
    print(tabulate(rows, headers=["node", "machine", "round", "bootstrap hears it", "state"]))
    return 0


def _status_keys(args: argparse.Namespace) -> tuple[Any, bytes | None]:
    """The keys to ask a mesh with (a closed mesh's from --keys, else a pair of this process's own; none with
    --insecure) and the public key of the member at --join: from its ticket, else --join-key."""
    import dataclasses

    from p2pfed.net import security

    if args.insecure:
        return None, None
    keys = security.load_keys(Path(args.keys)) if args.keys else security.ephemeral_keys()
    _, server_key = security.split_ticket(args.join)
    if server_key is None:
        where = keys if args.keys else dataclasses.replace(keys, home=security.default_key_home())
        server_key = security.resolve_key(args.join_key, where)
    if server_key is None:
        raise ConfigError(security.missing_key(args.join, "asking"))
    return keys, server_key


def cmd_mesh_status(args: argparse.Namespace) -> int:
    """Print the peers a mesh member knows."""
    from p2pfed.net.endpoint import query_status
    from p2pfed.net.transport import DeliveryError

    keys, server_key = _status_keys(args)
    try:
        reply = asyncio.run(query_status(args.join, mesh=args.mesh or "default", keys=keys,
                                         server_key=server_key, timeout=args.timeout, insecure=args.insecure))
    except DeliveryError as exc:
        print(f"p2pfed: no answer from {args.join}: {exc}", file=sys.stderr)
        return 1
    body = reply.body
    from p2pfed.net.security import parse_key, ticket

    me = {"name": reply.sender, "address": body["address"], "role": body["role"], "state": "alive",
          "age": 0.0, "round": body["round"], "incarnation": body["incarnation"], "pubkey": body["pubkey"]}
    # a member's ticket (address and key) is what joins through it, or asks it
    peers = [{**p, "ticket": ticket(p["address"], parse_key(p["pubkey"]))} for p in [me, *body["peers"]]]
    if args.json:
        print(json.dumps({"mesh": reply.mesh, "answered_by": reply.sender, "peers": peers}, indent=2))
        return 0
    rows = [[p["name"], p["ticket"], p["role"], p["state"], f"{p['age']:.1f}s ago", p["round"]] for p in peers]
    print(f"mesh {reply.mesh!r} as seen by {reply.sender} ({args.join}):")
    print(tabulate(rows, headers=["name", "ticket (join or ask it with --join TICKET)", "role", "state", "last seen",
                                  "round"]))
    alive = sum(p["state"] == "alive" for p in peers)
    print(f"{alive} alive of {len(peers)} known")
    return 0


def cmd_keys_generate(args: argparse.Namespace) -> int:
    """Write a CURVE key pair."""
    from p2pfed.net.security import generate_keys

    public, secret = generate_keys(Path(args.dir), args.name)
    print(f"public key: {public}\nsecret key: {secret} (keep it on this machine)")
    print(f"allow-list: {Path(args.dir) / 'allowed'} (copy every mesh member's public key into it)")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    """Run a scripted scenario on this machine: a progress bar per method, then the table."""
    from p2pfed.launch.failures import failure_lines
    from p2pfed.launch.runner import log_to_run_folder, prepare_run, run_interrupted
    from p2pfed.report.results import report_run

    methods = [m.strip() for m in args.methods.split(",") if m.strip()] if args.methods else None
    if args.seeds:
        return _run_seeds(args, methods)
    scenario, out = prepare_run(Path(args.scenario), Path(args.out) if args.out else None, methods,
                                args.overrides)
    log_to_run_folder(out)
    with ProgressBars(enabled=not args.quiet) as bars:
        interrupted = run_interrupted(scenario, out, bars.update)
    if interrupted:
        print(f"interrupted; partial run folder: {out}", file=sys.stderr)
        return 130
    print(report_run(out))
    print(f"\nrun folder: {out}")
    return _failed(failure_lines(out, methods=scenario.methods))  # this command's methods, not earlier ones


def _run_seeds(args: argparse.Namespace, methods: list[str] | None) -> int:
    """p2pfed run --seeds: the scenario once per seed, then the table of mean ± sd over the seeds."""
    import time

    from p2pfed.launch.failures import failure_lines
    from p2pfed.launch.runner import check_seeds_run, log_to_run_folder, run_seeds
    from p2pfed.methods import load_checked
    from p2pfed.report.seeds import crash_lines, seed_folders, seeds_table

    path = Path(args.scenario)
    name = load_checked(path, args.overrides).name
    out = Path(args.out) if args.out else Path("runs") / f"{name}-seeds-{time.strftime('%Y%m%d-%H%M%S')}"
    check_seeds_run(path, out, args.seeds, methods, args.overrides)  # a run that cannot start leaves no folder
    out.mkdir(parents=True, exist_ok=True)
    log_to_run_folder(out)
    with ProgressBars(enabled=not args.quiet) as bars:
        interrupted = run_seeds(path, out, args.seeds, methods, args.overrides, bars.update)
    if interrupted:
        print(f"interrupted; the seeds that ran are reported in {out} (the same command resumes)", file=sys.stderr)
        return 130
    summary = json.loads((out / "summary.json").read_text())
    print("\n".join([seeds_table(summary), *crash_lines(summary)]))
    print(f"\nrun folder: {out} (one run folder per seed: {out}/seed-S)")
    folders = seed_folders(out)
    return _failed([line for seed in args.seeds if seed in folders  # this command's seeds and methods
                    for line in failure_lines(folders[seed], f" seed {seed}", methods)],
                   " (the same command runs them again)")


def _failed(lines: list[str], hint: str = "") -> int:
    """Exit status 1 with one line per method whose members did not all do their part, else 0."""
    for line in lines:
        print(f"p2pfed: {line}", file=sys.stderr)
    if lines:
        print(f"p2pfed: the run did not complete: its table counts only the members that finished{hint}",
              file=sys.stderr)
    return 1 if lines else 0


MAX_SEEDS = 100
MAX_INDICES = 10_000  # node indices one `p2pfed node` process may run


def parse_seeds(text: str) -> list[int]:
    """--seeds: a count N (seeds 0 to N-1), or seeds and ranges: 0-3, 0,1,5, 7-7 (seed 7 alone)."""
    usage = (f"{text[:40]!r}: give a count (1 to {MAX_SEEDS}: 4 runs seeds 0-3) or distinct seeds >= 0 and "
             "ranges, such as 0-3, 0,1,5 or 7-7")
    try:
        if text.strip().isdigit():
            count = int(text)
            if not 1 <= count <= MAX_SEEDS:
                raise ValueError
            return list(range(count))
        return parse_ranges(text, MAX_SEEDS)
    except ValueError:
        raise argparse.ArgumentTypeError(usage) from None


def parse_index(text: str) -> list[int]:
    """--index: a node's index, or several: 0-24, 0,5,7."""
    try:
        return parse_ranges(text, MAX_INDICES)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text[:40]!r}: give node indices >= 0 and ranges, such as 3, 0-24 or "
                                         f"0,5,7 (distinct, at most {MAX_INDICES})") from None


def parse_ranges(text: str, most: int) -> list[int]:
    """'3', '0-3' or '0,1,5-7' as distinct numbers >= 0, at most `most` of them; ValueError otherwise."""
    numbers: list[int] = []
    for part in text.split(","):
        lo, dash, hi = part.strip().partition("-")
        first, last = int(lo), int(hi) if dash else int(lo)
        if not 0 <= first <= last or last - first + len(numbers) >= most:
            raise ValueError(text)
        numbers.extend(range(first, last + 1))
    if len(set(numbers)) != len(numbers):
        raise ValueError(text)
    return numbers


class ProgressBars:
    """One tqdm bar per method on standard error, the previous one closed when the next method starts."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.bars: dict[str, Any] = {}

    def update(self, method: str, done: int, total: int) -> None:
        if not self.enabled:
            return
        from tqdm import tqdm

        bar = self.bars.get(method)
        if bar is None:
            for other in self.bars.values():
                other.close()
            bar = self.bars[method] = tqdm(total=total, desc=f"{method:<12}", unit="round", file=sys.stderr)
        if done != bar.n:
            bar.n = done
            bar.refresh()

    def __enter__(self) -> ProgressBars:
        return self

    def __exit__(self, *exc: object) -> None:
        for bar in self.bars.values():
            bar.close()


def cmd_report(args: argparse.Namespace) -> int:
    """Redraw the table and plots of a run folder (of a run over seeds: of each seed's and of all); with --ship,
    copy what they are drawn from into a folder to commit, and redraw them there."""
    from p2pfed.report.results import report_run, results_table
    from p2pfed.report.seeds import crash_lines, is_seeds_folder, seeds_table, write_seeds_report
    from p2pfed.report.ship import ship_run

    if args.ship:
        summary = ship_run(Path(args.run_dir), Path(args.ship))
        print(seeds_table(summary) if "seeds" in summary else results_table(summary))
        print(f"shipped to {args.ship}: `p2pfed report {args.ship}` redraws this table and its plots from it")
        return 0
    if is_seeds_folder(Path(args.run_dir)):
        summary = write_seeds_report(Path(args.run_dir))
        print("\n".join([seeds_table(summary), *crash_lines(summary)]))
        return 0
    print(report_run(Path(args.run_dir)))
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    """Write a node's personalised model from its checkpoint as a model file of its own."""
    from p2pfed.learn.export import export_model, node_checkpoints

    source, out = Path(args.node_dir), Path(args.out)
    if source.is_file():
        checkpoint = source
    else:
        if not source.is_dir():
            raise FileNotFoundError(f"{source}: no such node folder or checkpoint")
        found = node_checkpoints(source)
        if args.node:
            if args.node not in found:
                raise FileNotFoundError(f"{source} holds no checkpoint of {args.node} (it has: "
                                        f"{', '.join(found) or 'none'})")
            found = {args.node: found[args.node]}
        if len(found) != 1:
            raise ValueError(f"{source} holds no node checkpoint (NAME.safetensors)" if not found else
                             f"{source} holds checkpoints of {', '.join(found)}: pick one with --node NAME")
        checkpoint = next(iter(found.values()))
    if out.is_dir():
        out = out / f"{checkpoint.name.removesuffix('.safetensors')}-model.safetensors"
    card = export_model(checkpoint, out)
    print(f"{out}: {card.node}'s personalised {card.model} ({card.method}, after round {card.round}) for inputs "
          f"{card.input_shape}, {card.num_classes} {'classes' if card.task == 'classification' else 'tokens'}")
    return 0


def cmd_predict(args: argparse.Namespace) -> int:
    """Predict the classes of inputs with an exported model; score them when labels are given."""
    from p2pfed.learn.export import ExportedModel, read_inputs
    from p2pfed.learn.tasks import NEXT_TOKEN

    model = ExportedModel.load(args.model)
    if model.card.task == NEXT_TOKEN.name:
        return _predict_text(model, args)
    if args.input is None or args.text:
        raise ConfigError(f"{args.model} classifies inputs of shape {model.card.input_shape}: give a file of them "
                          "(--text is for next-token models)")
    x, y, names = read_inputs(Path(args.input), model.card)
    probabilities = model.probabilities(x)
    best, labels = probabilities.max(dim=1)
    rows = [{"input": n, "class": int(c), "probability": round(float(p), 4)}
            for n, c, p in zip(names, labels, best, strict=True)]
    if y is not None:
        for row, truth in zip(rows, y.tolist(), strict=True):
            row["label"] = int(truth)
    _print_rows(rows, args)
    if y is not None:
        accuracy = float((labels == y).float().mean()) if len(y) else 0.0
        print(f"accuracy {accuracy:.2%} on {len(y)} labelled inputs", file=sys.stderr if args.json else sys.stdout)
    return 0


def _print_rows(rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    """predict's rows: one JSON list (--json), or a table of the first --show of them."""
    if args.json:
        print(json.dumps(rows))
    else:
        print(tabulate(rows[: args.show] if args.show else rows, headers="keys"))
        if args.show and len(rows) > args.show:
            print(f"... {len(rows) - args.show} more (--show 0 prints all, --json prints JSON)")


def _predict_text(model: ExportedModel, args: argparse.Namespace) -> int:
    """A next-token model on texts (--text, or a file of one a line): each text's loss per character and
    next-character accuracy, and what the model writes after it."""
    from p2pfed.learn.text import read_text

    if bool(args.input) == bool(args.text):
        raise ConfigError(f"{args.model} predicts text: give a text file (one word or sequence a line) or --text, "
                          "one of them")
    if args.input and not Path(args.input).is_file():
        raise ConfigError(f"{args.input} is not a file: give a text file (one word or sequence a line), or --text")
    texts = args.text or [line.strip() for line in read_text(Path(args.input)).splitlines() if line.strip()]
    if not texts:
        raise ConfigError(f"{args.input}: no text in it")
    try:
        scores = model.score(texts)
    except ValueError as exc:
        raise ConfigError(f"{args.input or '--text'}: {exc}") from None
    rows = [{"text": t, "loss/char": round(loss, 4), "accuracy": round(acc, 4), "continues as": then}
            for t, (loss, acc, _), then in zip(texts, scores, model.complete(texts), strict=True)]
    _print_rows(rows, args)
    characters = sum(n for *_, n in scores)
    loss = sum(x * n for x, _, n in scores) / characters
    accuracy = sum(a * n for _, a, n in scores) / characters
    texts_said = f"{len(texts)} text{'s' if len(texts) > 1 else ''}"
    print(f"loss {loss:.4f} nats/char (perplexity {math.exp(loss):.2f}), accuracy {accuracy:.2%} on {characters} "
          f"characters of {texts_said}", file=sys.stderr if args.json else sys.stdout)
    return 0


def cmd_convert(args: argparse.Namespace) -> int:
    """Rewrite checkpoints of an earlier p2pfed (pickle) as safetensors, once."""
    from p2pfed.learn.checkpoint import convert

    for old in args.files:
        print(f"{old} -> {convert(Path(old))}")
    return 0


LOCAL = ("127.0.0.1", "localhost", "::1")  # a dashboard served here only, which checks requests' Host


def cmd_dashboard(args: argparse.Namespace) -> int:
    """Serve the dashboard of a live mesh (--join) or of a run folder."""
    from p2pfed.dashboard.server import MeshWatcher, make_app, serve
    from p2pfed.dashboard.view import run_view

    if bool(args.join) == bool(args.run_dir):
        raise ConfigError("p2pfed dashboard takes --join tcp://HOST:PORT (a live mesh) or a run folder, one of them")

    def started(url: str) -> None:
        print(f"p2pfed dashboard: open {url}  (Ctrl-C stops it)", flush=True)

    if args.run_dir:
        folder = Path(args.run_dir)
        run_view(folder)  # a folder that is not a run's is refused now, not in the page
        app = make_app(lambda: run_view(folder), local_only=args.host in LOCAL)
        return _run_until_signal(lambda stop: serve(app, args.host, args.port, stop, started))
    keys, join_key = _status_keys(args)

    async def live(stop: asyncio.Event) -> None:
        watcher = MeshWatcher(args.join, mesh=args.mesh or "default", keys=keys, join_key=join_key,
                              every=args.every, insecure=args.insecure)
        await watcher.start()
        try:
            await serve(make_app(lambda: watcher.view, local_only=args.host in LOCAL), args.host, args.port, stop,
                        started)
        finally:
            await watcher.stop()

    return _run_until_signal(live)


def _add_model_commands(sub: Any) -> None:
    """export, predict, convert: a node's personalised model out of its checkpoint, and put to use."""
    p = sub.add_parser("export", help="write a node's personalised model (safetensors, with its card)")
    p.add_argument("node_dir", help="the node's folder (its --out), a run's method folder with --node, or a "
                                    "checkpoint NAME.safetensors")
    p.add_argument("out", help="the model file to write (or a folder: NAME-model.safetensors in it)")
    p.add_argument("--node", help="which node's, when the folder holds several")
    p.set_defaults(func=cmd_export, verbose=0)

    p = sub.add_parser("predict", help="classify inputs, or score and continue text, with an exported model")
    p.add_argument("model", help="a model file from p2pfed export")
    p.add_argument("input", nargs="?", help="an .npz of x (and y to score), an .npy, an image, a folder of images, "
                                            "or a folder of class folders of images (labels to score); for a "
                                            "next-token model, a text file (one text a line)")
    p.add_argument("--text", action="append", help="a text for a next-token model (repeatable), instead of a file")
    p.add_argument("--json", action="store_true", help="print one JSON list")
    p.add_argument("--show", type=int, default=20, help="rows of the table to print (0: all)")
    p.set_defaults(func=cmd_predict, verbose=0)

    p = sub.add_parser("dashboard", help="a web page of a live mesh (--join) or of a run folder")
    p.add_argument("run_dir", nargs="?", help="a run folder (p2pfed run --out) or a node's folder, instead of --join")
    p.add_argument("--join", help="the ticket tcp://HOST:PORT/KEY of any member of the live mesh")
    p.add_argument("--port", type=int, default=8050, help="the page's port (0 picks one)")
    p.add_argument("--host", default="127.0.0.1", help="address to serve on (0.0.0.0: for other machines too)")
    p.add_argument("--mesh", help="mesh name (default: default)")
    _add_asking_key_args(p)
    p.add_argument("--every", type=float, default=2.0, help="seconds between looks at the mesh")
    p.add_argument("-v", "--verbose", action="count", default=0, help="more log lines (-vv: debug)")
    p.set_defaults(func=cmd_dashboard)

    p = sub.add_parser("convert", help="rewrite an earlier p2pfed's pickled checkpoints as safetensors")
    p.add_argument("files", nargs="+", help="NAME.ckpt, NAME.kept or coordinator.ckpt files you wrote")
    p.set_defaults(func=cmd_convert, verbose=0)


INSECURE_HELP = ("plain TCP without keys, on every member of the mesh: anyone who can reach a member reads its "
                 "models and speaks in any member's name (a network where every host is trusted)")
JOIN_KEY_HELP = ("the public key of the member at --join, when --join is an address without one: 64 hex digits, a "
                 "NAME.key file, or a member's name whose key file is in the key folder")


def _add_asking_key_args(p: argparse.ArgumentParser) -> None:
    """The key arguments of the commands that ask a mesh without joining it (mesh status, dashboard)."""
    p.add_argument("--keys", help="a closed mesh's key folder (with allowed/); else a key pair of its own is used")
    p.add_argument("--join-key", dest="join_key", default="bootstrap", help=JOIN_KEY_HELP)
    p.add_argument("--insecure", action="store_true", help="ask an --insecure mesh (plain TCP)")


def _add_member_args(p: argparse.ArgumentParser, join: bool) -> None:
    p.add_argument("--bind", help="address to listen on, tcp://IP:PORT (port 0 picks one)")
    if join:
        p.add_argument("--join", action="append", metavar="TICKET",
                       help="tcp://HOST:PORT/KEY, the ticket of the bootstrap or of any live member, as it prints at "
                            "its start (repeatable)")
    p.add_argument("--name", help="this member's name (default: host name; reuse it to rejoin after a restart)")
    p.add_argument("--advertise", help="address peers should dial, when --bind is a wildcard behind NAT")
    p.add_argument("--config", help="TOML file (see node/node.toml, bootstrap/bootstrap.toml)")
    p.add_argument("--mesh", help="mesh name (members of other meshes are refused)")
    p.add_argument("--keys", help="key folder (default ~/.p2pfed/keys): this member's key pair NAME.key_secret, "
                                  "made on its first start; a folder from 'p2pfed keys generate' (with allowed/) "
                                  "makes a closed mesh")
    p.add_argument("--join-key", dest="join_key", help=JOIN_KEY_HELP)
    p.add_argument("--insecure", action="store_true", help=INSECURE_HELP)
    p.add_argument("--discovery", help="mqtt://BROKER:PORT/MESH: find peers through an MQTT broker")
    p.add_argument("-v", "--verbose", action="count", default=1, help="debug log lines (members log INFO already)")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    parser = argparse.ArgumentParser(prog="p2pfed", description=__doc__.split("\n\n")[0].replace("\n", " "))
    sub = parser.add_subparsers(dest="command", required=True)
    _add_member_commands(sub)
    _add_tool_commands(sub)
    _add_run_commands(sub)
    _add_deploy_command(sub)
    _add_model_commands(sub)
    return parser


def _add_member_commands(sub: Any) -> None:
    """bootstrap, node, coordinator: the members of a mesh, one per process."""
    p = sub.add_parser("bootstrap", help="start the rendezvous a mesh grows from")
    _add_member_args(p, join=True)
    p.set_defaults(func=cmd_bootstrap)

    p = sub.add_parser("node", help="start a node that joins a mesh")
    _add_member_args(p, join=True)
    p.add_argument("--scenario", "--recipe", dest="scenario",
                   help="learn: the scenario TOML the mesh shares (model, method, training); this node's shard of "
                        "its data with --index, or its own data with --data")
    p.add_argument("--data", help="this machine's own data: an .npz (x, y), a .csv (features and a label column) "
                                  "or an ImageFolder; split here into training, validation and test, never sent")
    p.add_argument("--index", type=parse_index,
                   help="with --scenario: this node's index (its shard), or several: 0-24 or 0,5,7")
    p.add_argument("--method", help="with --scenario: the method to run (default pfedlia-p2p, or the "
                                    "coordinator's with --coordinator)")
    p.add_argument("--coordinator", help="train under this coordinator (its name, or its ticket tcp://HOST:PORT/KEY); "
                                         "the method comes from it")
    p.add_argument("--out", default="runs/node", help="with --scenario: folder for metrics and checkpoints (and "
                                                      "the node's model, for p2pfed export)")
    p.add_argument("--start-round", dest="start_round", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--wait-for", dest="wait_for", type=int, default=0,
                   help="with --scenario: wait until this many peers are alive before round 0")
    p.add_argument("--send-delay", dest="send_delay", type=float, default=0.0, help=argparse.SUPPRESS)
    p.set_defaults(func=cmd_node)

    p = sub.add_parser("coordinator", help="serve a coordinated method (fedavg, fesem, pfedlia-central, ...)")
    _add_member_args(p, join=True)
    p.add_argument("--scenario", required=True, help="scenario TOML: model, rounds, participation, options")
    p.add_argument("--method", required=True, help="the coordinated method to run")
    p.add_argument("--out", default="runs/coordinator", help="folder for coordinator.jsonl")
    p.add_argument("--state", help="folder for the checkpoint (default: --out); a restart resumes from it")
    p.add_argument("--wait-for", dest="wait_for", type=int, default=0,
                   help="wait until this many nodes are alive before round 0")
    p.set_defaults(func=cmd_coordinator)



def _add_deploy_command(sub: Any) -> None:
    """deploy: nodes with their own data on a Ray cluster's machines, from one command."""
    p = sub.add_parser("deploy", help="start nodes with their own data on the machines of a Ray cluster "
                                      "(pip install -e '.[ray]')")
    p.add_argument("recipe", help="the recipe TOML the mesh shares (model, method, training), e.g. node/recipe.toml")
    p.add_argument("--data", action="append", required=True, metavar="[NAME=]HOST:PATH",
                   help="one node: its data at PATH on the cluster's machine HOST (its address in the cluster), "
                        "named NAME (default: the file's stem); repeat for each node")
    p.add_argument("--address", help="the Ray cluster (HEAD:6379; default: a cluster of this machine alone)")
    p.add_argument("--method", help="the method the nodes run (default: the recipe's first)")
    p.add_argument("--out", help="folder for the nodes' records and logs (default: runs/deploy-TIME)")
    p.add_argument("--mesh", default="default", help="the mesh's name (default: default)")
    p.add_argument("--port", type=int, default=0, help="the bootstrap's port (default: any free one)")
    p.add_argument("--cpus", type=float, default=1.0, help="CPUs Ray reserves for each node (default 1)")
    p.add_argument("--gpus", type=float, default=0.0, help="the share of a GPU each node is given (default 0)")
    p.add_argument("--restarts", type=int, default=1, help="times Ray restarts a node's dead process (default 1)")
    p.add_argument("--insecure", action="store_true", help="plain TCP without keys: only where every host is trusted")
    p.add_argument("--ray-unauthenticated", action="store_true",
                   help="join a Ray cluster that runs without token authentication (with a warning): only where "
                        "every host is trusted")
    p.add_argument("--detach", action="store_true",
                   help="leave the nodes running on the cluster (at --address) and return: see them with `p2pfed "
                        "deployment status NAME`, stop them with `p2pfed deployment stop NAME`")
    p.add_argument("--name", help="the detached deployment's name (default: the deploy folder's)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.add_argument("-v", "--verbose", action="count", default=0, help="more log lines (-vv: debug)")
    p.set_defaults(func=cmd_deploy)

    p = sub.add_parser("deployment", help="look at or stop a detached deployment (p2pfed deploy --detach)")
    p.add_argument("action", choices=["status", "stop"],
                   help="status: each node's machine, round and state (no NAME: the cluster's deployments); stop: "
                        "every node leaves the mesh, their records are gathered, and every actor ends")
    p.add_argument("name", nargs="?", help="the deployment's name (p2pfed deploy --detach printed it)")
    p.add_argument("--address", help="the Ray cluster (HEAD:6379; default: RAY_ADDRESS)")
    p.add_argument("--out", help="stop: where the records of nodes that could not write to the deploy folder go "
                                 "(default: the deploy folder)")
    p.add_argument("--ray-unauthenticated", action="store_true",
                   help="join a Ray cluster that runs without token authentication (with a warning): only where "
                        "every host is trusted")
    p.add_argument("-v", "--verbose", action="count", default=0, help="more log lines (-vv: debug)")
    p.set_defaults(func=cmd_deployment)


def _add_tool_commands(sub: Any) -> None:
    """mesh status, keys generate: looking at a mesh and securing one."""
    p = sub.add_parser("mesh", help="look at a running mesh")
    mesh_sub = p.add_subparsers(dest="mesh_command", required=True)
    ps = mesh_sub.add_parser("status", help="print the peers a mesh knows")
    ps.add_argument("--join", required=True, help="the ticket tcp://HOST:PORT/KEY of any member")
    ps.add_argument("--json", action="store_true", help="print one JSON object")
    ps.add_argument("--mesh", help="mesh name (default: default)")
    _add_asking_key_args(ps)
    ps.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for the members' answers")
    ps.set_defaults(func=cmd_mesh_status, verbose=0)

    p = sub.add_parser("keys", help="CURVE key pairs")
    keys_sub = p.add_subparsers(dest="keys_command", required=True)
    pk = keys_sub.add_parser("generate", help="write a key pair into DIR")
    pk.add_argument("dir", help="the key folder to write (NAME.key, NAME.key_secret and allowed/)")
    pk.add_argument("--name", default="node", help="file name of the pair (NAME.key, NAME.key_secret)")
    pk.set_defaults(func=cmd_keys_generate, verbose=0)



def _add_run_commands(sub: Any) -> None:
    """run, report: scripted scenarios on this machine and their run folders."""
    p = sub.add_parser("run", help="run a scripted scenario (many nodes on this machine, real sockets)")
    p.add_argument("scenario", help="scenario TOML, e.g. scenarios/quickstart.toml")
    p.add_argument("--out", help="run folder (default: runs/NAME-TIMESTAMP); methods already in it are kept "
                                 "(same scenario only)")
    p.add_argument("--methods", help="run only these of the scenario's methods (comma-separated)")
    p.add_argument("--set", dest="overrides", action="append", metavar="TABLE.KEY=VALUE", default=[],
                   help="change one setting of the scenario, e.g. --set scenario.seed=1 --set "
                        "data.partition.clusters=10 or --set \"scenario.methods=['ifca']\", or a method's own "
                        "option: --set methods.perfedavg.inner_lr=0.02 (a TOML value; repeatable; the run "
                        "folder's scenario.toml records the result)")
    p.add_argument("--seeds", type=parse_seeds, metavar="N|LIST",
                   help="run the scenario once per seed (4: seeds 0-3; or 0-3, 0,1,5, 7-7), each into OUT/seed-S, "
                        "and report mean ± standard deviation over every seed in OUT; the same command resumes an "
                        "interrupted run")
    p.add_argument("--insecure", action="store_true", help="the nodes talk plain TCP without keys (as --set "
                                                               "mesh.insecure=true): to measure what keys cost")
    p.add_argument("--engine", choices=("local", "ray"),
                   help="what starts the worker processes (as --set scenario.engine=...): local (this machine, the "
                        "default) or ray (placed by Ray over a cluster; pip install -e '.[ray]')")
    p.add_argument("--address", metavar="HOST:PORT",
                   help="with --engine ray: the Ray cluster to run on (as --set ray.address=...; default: a "
                        "cluster of this machine alone, started for the run)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.add_argument("-v", "--verbose", action="count", default=0, help="more log lines (-vv: debug)")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("report", help="redraw the table and plots of a run folder")
    p.add_argument("run_dir", help="a run folder (runs/NAME-TIMESTAMP), or the OUT of a run over --seeds")
    p.add_argument("--ship", metavar="DEST", help="also copy what the report is drawn from (partition, scenario, "
                                                  "each node's metrics, compressed; no checkpoints) into the new "
                                                  "folder DEST, to commit beside the results it shows")
    p.set_defaults(func=cmd_report, verbose=0)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the p2pfed command."""
    args = build_parser().parse_args(argv)
    _setup_logging(args.verbose)
    if getattr(args, "insecure", False):
        print(f"p2pfed: WARNING: --insecure: {INSECURE_HELP}", file=sys.stderr)
        if args.command == "run":
            args.overrides.append("mesh.insecure=true")
    if args.command == "run":  # what places the run: settings of the scenario, recorded in its run folder's copy
        if args.address and args.engine not in (None, "ray"):
            print("p2pfed: --address is a Ray cluster's: it goes with --engine ray", file=sys.stderr)
            return 2
        if args.engine or args.address:
            args.overrides.append("scenario.engine=ray" if args.address else f"scenario.engine={args.engine}")
        if args.address:
            args.overrides.append(f"ray.address={args.address}")
    try:
        return int(args.func(args))
    except (ConfigError, ValueError, FileNotFoundError, FileExistsError, OSError) as exc:
        print(f"p2pfed: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # Ray's own errors (a cluster lost mid-run) in one line; anything else is a bug
        if not type(exc).__module__.startswith("ray."):
            raise
        print(f"p2pfed: Ray: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
