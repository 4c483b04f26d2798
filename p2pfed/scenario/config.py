"""A scenario: dataset, partition, model, nodes, rounds, methods and scripted events, from one TOML file.

Every node derives its own shard from the same scenario and seed, so the same file drives nodes on this
machine (``p2pfed run``) or on many (``p2pfed node --scenario FILE --index I``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from p2pfed.config import ConfigError, MeshConfig, fill, read_toml
from p2pfed.learn.datasets import DATASETS, is_text
from p2pfed.learn.labels import DATASET_OF
from p2pfed.learn.models import MODELS, SEQUENCE_MODELS
from p2pfed.learn.partition import PARTITIONS, PartitionOptions, Pathological
from p2pfed.scenario.migrate import Former, migrate, tables
from p2pfed.wire.messages import clip, is_name

ACTIONS = ("join", "leave", "crash", "slow")
ADVERSARIES = ("label-flip", "noise-model", "free-rider")  # what each does: p2pfed/launch/adversary.py
SCENARIO_TABLES = ("scenario", "data", "train", "mesh", "ray")
ENGINES = ("local", "ray")  # what places a scenario's node processes (launch/runner.py, launch/ray_engine.py)
PLACEMENTS = ("spread", "pack")  # Ray placement group strategies: SPREAD and PACK


@dataclass
class DataConfig:
    """Which data, and how it is split over the nodes."""

    dataset: str = "digits"  # a dataset p2pfed knows (learn/datasets.py), words:DIR, or a node's own data's kind
    root: str = ""  # the folder the dataset's files are read from or downloaded to ("": the dataset's default)
    val_fraction: float = 0.2  # the share of each node's samples it validates on (where it scores its peers' models)
    max_train: int = 0  # cap on each node's training samples (0: no cap), for scarce-data settings
    # cap on each node's validation samples (0: no cap): with max_train, a scarce node keeps val_fraction's
    # 80/20 split (max_train = 40, max_val = 10) instead of holding far more samples out than it trains on
    max_val: int = 0
    # training samples per class set aside for the server before the partition deals the rest (0: none):
    # Li et al. 2022 draw their 10 indicator samples per class "before partitioning the client data"
    server_per_class: int = 0
    # test samples the coordinator holds out and tests the method's one global model on, after every evaluation
    # (0: none; more than the test split: all of it): Ye et al. 2023 report "the testing accuracy of the best
    # model on the testing dataset" held at the server, the best model being the one whose mean local validation
    # accuracy is highest (report/results.py: server_test_accuracy)
    server_test: int = 0
    # a node with its own data (p2pfed node --data): the share of its samples it tests on (val_fraction: that it
    # validates on)
    test_fraction: float = 0.2
    # own data of a kind p2pfed does not know (data.dataset is not one of its datasets): the input shape and the
    # class count every member's data must have
    input_shape: list[int] = field(default_factory=list)
    classes: int = 0  # own data of a kind p2pfed does not know: the number of classes
    class_names: list[str] = field(default_factory=list)  # an ImageFolder's class folders, in class order
    # own text (next-token prediction): the letters every member's words are spelt with ("": those of the text
    # dataset data.dataset names, read on each machine)
    vocabulary: str = ""
    # text: the words of a sample (1: a word a sample; n > 1: n consecutive words joined by spaces, learn/text.py)
    words_per_sample: int = 1
    # the [data.partition] table: kind (the partition's name) and that partition's own options
    # (learn/partition.py), filled by load_scenario
    partition: PartitionOptions = field(default_factory=Pathological)

    @property
    def clusters(self) -> int:
        """How many clusters the partition is built from (0: it has none), the K of a method not told one."""
        return self.partition.true_clusters()


@dataclass
class TrainConfig:
    """Local training each round, participation and the round deadline."""

    model: str = "cnn"  # the model every node trains (learn/models.py; it must read data.dataset)
    epochs: int = 1  # local epochs a round (unless steps is set)
    batch_size: int = 16  # local mini-batch size
    lr: float = 0.05  # local SGD learning rate
    momentum: float = 0.0  # local SGD momentum
    weight_decay: float = 0.0  # the optimiser's L2 weight decay (Ye et al. 2023: 1e-5)
    # local mini-batch steps τ per round instead of epochs (0: epochs; Li et al. 2022: 20, Ma et al. 2023: 10)
    steps: int = 0
    participation: float = 1.0  # the share of nodes that train each round (a seeded draw every machine agrees on)
    round_timeout: float = 60.0  # seconds a round waits for peers' models before going on without them
    device: str = "auto"  # "auto" (the GPU when there is one), "cpu", "cuda" or "cuda:N"
    eval_every: int = 1  # evaluate the personalised model every k rounds (and always after the last)


@dataclass
class RayConfig:
    """Where Ray places a scenario's node processes (scenario.engine = "ray", launch/ray_engine.py): the cluster
    and what each worker process is given. Ray only places and supervises them; they still talk ZeroMQ."""

    # the cluster to join: "HOST:6379" (a head started with `ray start --head`), "auto" (the cluster this machine
    # belongs to), or "" to start a cluster of this machine alone for the run
    address: str = ""
    cpus: float = 1.0  # CPUs Ray reserves for each worker process (an actor): workers per machine = its CPUs / cpus
    gpus: float = 0.0  # the share of a GPU each worker process is given (0.25: four share one GPU)
    placement: str = "spread"  # spread the worker processes over the cluster's machines, or pack them on few
    restarts: int = 1  # times Ray restarts a dead worker process (its nodes resume from their checkpoints)
    # join a cluster at an address only with Ray's token authentication on (RAY_AUTH_MODE=token): Ray runs any
    # code it is sent, unpickled, on every machine of the cluster. false: on a network where every host is
    # trusted, join one without (with a warning)
    authenticated: bool = True

    def validate(self, where: str = "") -> None:
        checks = [
            (0 < self.cpus <= 1024, f"{where}cpus must be in (0, 1024] (got {self.cpus})"),
            (0 <= self.gpus <= 64, f"{where}gpus must be in [0, 64] (got {self.gpus})"),
            (self.placement in PLACEMENTS,
             f"{where}placement must be one of {', '.join(PLACEMENTS)} (got {clip(self.placement, 40)})"),
            (0 <= self.restarts <= 100, f"{where}restarts must be in [0, 100] (got {self.restarts})"),
            (len(self.address) <= 256 and all(c.isalnum() or c in ".:-_[]/" for c in self.address),
             f"{where}address must be HOST:PORT, auto, or empty (got {clip(self.address, 40)})"),
        ]
        for ok, message in checks:
            if not ok:
                raise ConfigError(message)


@dataclass
class Event:
    """A scripted event: a node joins late, leaves, crashes (and restarts), or its link slows."""

    round: int = 0  # the round at which it happens
    action: str = "join"  # join | leave | crash | slow
    node: int = 0  # the index of the node it happens to
    restart_after: int = 0  # crash: rounds until the node restarts from its checkpoint (0: never)
    via: int = -1  # join: the node whose ticket the joiner joins through (-1: the bootstrap's)
    delay: float = 0.0  # slow: seconds added to every model the node sends


@dataclass
class Adversary:
    """A scripted adversary: node index poisons its data or models (p2pfed/launch/adversary.py)."""

    node: int = 0  # the index of the adversarial node
    kind: str = "label-flip"  # label-flip | noise-model | free-rider


@dataclass
class Scenario:
    """A whole experiment."""

    name: str = "scenario"  # names the run folder (runs/NAME-TIMESTAMP) and each method's mesh
    seed: int = 0  # seeds the partition, the models' initialisation and every draw of the run
    nodes: int = 20  # how many learning nodes
    rounds: int = 20  # how many rounds each method runs
    methods: list[str] = field(default_factory=list)  # the methods to run (checked by methods.check_scenario)
    processes: bool = False  # one process per node (as on separate machines)
    workers: int = 1  # or: spread the nodes over this many processes (a process's open files are limited)
    # what starts those processes: "local" (this machine), or "ray" (placed by Ray over a cluster, [ray])
    engine: str = "local"
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    mesh: MeshConfig = field(default_factory=MeshConfig)
    ray: RayConfig = field(default_factory=RayConfig)
    events: list[Event] = field(default_factory=list)
    adversaries: list[Adversary] = field(default_factory=list)
    # the [methods.NAME] tables: each a method's own options, read and checked by that method
    # (methods/options.py); kept here as plain tables, since this module sits below the methods
    method_tables: dict[str, dict[str, Any]] = field(default_factory=dict)
    path: str = ""

    def mesh_name(self, method: str) -> str:
        """The mesh a method's run of this scenario uses (each method its own, so runs never mix)."""
        return f"{self.name}-{method}"[:64]

    def mesh_for(self, method: str) -> MeshConfig:
        """The scenario's mesh settings, named for a method's run."""
        return dataclasses.replace(self.mesh, mesh=self.mesh_name(method))

    def adversary_of(self, index: int) -> str | None:
        """The kind of adversary node index is, None for an honest node."""
        return next((a.kind for a in self.adversaries if a.node == index), None)

    def settings(self, *ignore: str) -> dict[str, Any]:
        """What makes two runs comparable, by table: every setting but the methods, the file it came from, where
        the run was placed (engine, [ray]: the same seed gives the same results on any) and the [scenario] keys in
        ignore (a run over seeds compares its seeds' runs without scenario.seed)."""
        settings = {k: v for k, v in dataclasses.asdict(self).items()
                    if k not in ("methods", "path", "engine", "ray")}
        settings["data"]["partition"]["kind"] = self.data.partition.kind  # a class's name, not a field
        for key in ignore:
            settings.pop(key, None)
        return settings

    def differs_from(self, other: Scenario, *ignore: str) -> list[str]:
        """The names of the settings where two scenarios differ (empty: their runs can share a report)."""
        mine, theirs = self.settings(*ignore), other.settings(*ignore)
        return [k for k in mine if theirs.get(k) != mine[k]]

    def fingerprint(self, method: str, input_shape: Sequence[int], classes: int, task: str,
                    vocabulary: str = "") -> str:
        """What members of one mesh must agree on, as 16 hex digits: the model and the input and outputs it is
        built for (a text model: its vocabulary, in order), the method with its options, the training, the
        rounds and the seed of the shared initial model. Not the data (each member's own) nor what is only
        this machine's (device, deadlines)."""
        train = {k: v for k, v in dataclasses.asdict(self.train).items()
                 if k not in ("device", "round_timeout", "eval_every")}
        # the method's table and those it inherits (a variant NAME-paper takes the table of NAME)
        options = {k: v for k, v in self.method_tables.items() if method == k or method.startswith(k + "-")}
        recipe = {"model": self.train.model, "input_shape": list(input_shape), "classes": classes, "task": task,
                  "class_names": self.data.class_names, "vocabulary": vocabulary,
                  "method": method, "options": options, "train": train,
                  "rounds": self.rounds, "seed": self.seed}
        return hashlib.sha256(json.dumps(recipe, sort_keys=True, default=str).encode()).hexdigest()[:16]

    def node_name(self, index: int) -> str:
        """The name of node index (n00, n01, ...), the same on every machine."""
        return f"n{index:0{max(2, len(str(self.nodes - 1)))}d}"

    def validate(self, where: str = "") -> None:
        """Raise ConfigError naming the key of anything that cannot work (what needs the methods themselves,
        their names and options, is checked by methods.check_scenario: this module is plain data, below them)."""
        for ok, message in self._setting_checks():
            if not ok:
                raise ConfigError(f"{where}{message}")
        try:
            self.data.partition.validate(f"{where}data.partition.", self.nodes)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        if self.data.partition.transforms_inputs and is_text(self.data.dataset):
            raise ConfigError(f"{where}data.partition.kind: the {self.data.partition.kind} partition transforms "
                              f"images; {self.data.dataset!r} is text")
        groups = getattr(self.data.partition, "label_groups", "none")
        if groups in DATASET_OF and self.data.dataset in DATASETS and DATASET_OF[groups] != self.data.dataset:
            raise ConfigError(f"{where}data.partition.label_groups: {groups} groups the labels of "
                              f"{DATASET_OF[groups]}, not of {self.data.dataset}")
        self._check_scripted(where)
        self.mesh.validate(f"{where}mesh.")
        self.ray.validate(f"{where}ray.")
        if self.engine == "ray" and self.ray.gpus == 0 and self.train.device.startswith("cuda"):
            raise ConfigError(f"{where}train.device = {self.train.device!r}, but Ray hides every GPU from a worker "
                              "process given none: set ray.gpus (0.25 has four share one) or train.device = \"cpu\"")

    def _setting_checks(self) -> list[tuple[bool, str]]:
        """(holds, what to say if not) for the [scenario], [data] and [train] settings."""
        text = is_text(self.data.dataset) or bool(self.data.vocabulary)  # a recipe for own words is text too
        return [
            (is_name(self.name), f"scenario.name must be up to 64 letters, digits, '-', '_' or '.' (it names "
             f"the mesh; got {self.name!r})"),
            (self.nodes >= 2, "scenario.nodes must be at least 2"),
            (self.rounds >= 1, "scenario.rounds must be at least 1"),
            (self.data.dataset in DATASETS or is_text(self.data.dataset) or self.data.dataset.endswith(".npz")
             or Path(self.data.dataset).is_dir(), f"data.dataset must be one of {', '.join(DATASETS)} or a path"),
            (self.train.model in MODELS, f"train.model must be one of {', '.join(MODELS)}"),
            (text == (self.train.model in SEQUENCE_MODELS),
             f"train.model {self.train.model!r} cannot read {self.data.dataset!r}: "
             + (f"text takes a sequence model ({', '.join(SEQUENCE_MODELS)})" if text
                else f"{', '.join(SEQUENCE_MODELS)} takes text (scandinavian, words:DIR, or own words spelt with "
                     "data.vocabulary)")),
            (0 < self.train.participation <= 1, "train.participation must be in (0, 1]"),
            (self.train.eval_every >= 1, "train.eval_every must be at least 1"),
            (0 <= self.data.val_fraction < 1, "data.val_fraction must be in [0, 1)"),
            (0 < self.data.test_fraction < 1, "data.test_fraction must be in (0, 1)"),
            (all(1 <= d <= 100_000 for d in self.data.input_shape) and len(self.data.input_shape) <= 4,
             "data.input_shape must be up to 4 sizes, each 1 to 100000"),
            (0 <= self.data.classes <= 1_000_000, "data.classes must be in [0, 1000000]"),
            (self.data.max_train >= 0 and self.data.max_val >= 0,
             "data.max_train and data.max_val must be >= 0 (0: no cap)"),
            (0 <= self.data.server_per_class <= 10_000, "data.server_per_class must be in [0, 10000]"),
            (0 <= self.data.server_test <= 10_000_000, "data.server_test must be in [0, 10000000]"),
            (not self.data.server_test or self.data.val_fraction > 0,
             "data.server_test picks the served model by the nodes' validation accuracy: data.val_fraction must be "
             "> 0"),
            (1 <= self.data.words_per_sample <= 16, "data.words_per_sample must be in [1, 16]"),
            (self.data.words_per_sample == 1 or is_text(self.data.dataset) or bool(self.data.vocabulary),
             "data.words_per_sample is for text (scandinavian, words:DIR, or own words with data.vocabulary)"),
            (self.train.epochs >= 1 and self.train.batch_size >= 1 and self.train.lr > 0,
             "train.epochs, train.batch_size and train.lr must be positive"),
            (0 <= self.train.momentum < 1 and 0 <= self.train.weight_decay < 1 and 0 <= self.train.steps <= 100_000,
             "train.momentum and train.weight_decay must be in [0, 1) and train.steps in [0, 100000] (0: epochs)"),
        ]

    def _check_scripted(self, where: str) -> None:
        """The [methods.NAME] tables' shape, the workers, the scripted events and adversaries."""
        for name, table in self.method_tables.items():
            if not isinstance(table, dict):
                raise ConfigError(f"{where}methods.{name} must be a table of the method's options, "
                                  f"[methods.{name}]")
        if self.workers < 1:
            raise ConfigError(f"{where}workers must be at least 1")
        if self.engine not in ENGINES:
            raise ConfigError(f"{where}engine must be one of {', '.join(ENGINES)} (got {clip(self.engine, 40)})")
        if self.events and self.engine == "ray" and not self.processes:
            raise ConfigError(f"{where}events on Ray need processes = true (a node a worker process: a scripted "
                              "crash stops one node, not its whole process)")
        if self.workers > self.nodes:
            raise ConfigError(f"{where}workers ({self.workers}) must be at most scenario.nodes ({self.nodes})")
        if self.events and self.workers > 1 and not self.processes:
            raise ConfigError(f"{where}events need workers = 1 (all nodes here) or processes = true")
        for i, adv in enumerate(self.adversaries):
            if adv.kind not in ADVERSARIES:
                raise ConfigError(f"{where}adversaries[{i}].kind must be one of {', '.join(ADVERSARIES)}")
            if adv.kind == "label-flip" and is_text(self.data.dataset):
                raise ConfigError(f"{where}adversaries[{i}].kind: label-flip flips class labels, and the next-token "
                                  f"task of {self.data.dataset!r} has none (noise-model and free-rider work)")
            if not 0 <= adv.node < self.nodes:
                raise ConfigError(f"{where}adversaries[{i}].node {adv.node} is outside the scenario")
        if len({a.node for a in self.adversaries}) < len(self.adversaries):
            raise ConfigError(f"{where}adversaries: a node can be one adversary only")
        for i, ev in enumerate(self.events):
            if ev.action not in ACTIONS:
                raise ConfigError(f"{where}events[{i}].action must be one of {', '.join(ACTIONS)}")
            if not 0 <= ev.node < self.nodes or not 0 <= ev.round < self.rounds:
                raise ConfigError(f"{where}events[{i}] names node {ev.node} / round {ev.round} outside the scenario")
            if ev.via != -1 and (ev.action != "join" or not 0 <= ev.via < self.nodes or ev.via == ev.node):
                raise ConfigError(f"{where}events[{i}].via: a join goes through another node of the scenario (0.."
                                  f"{self.nodes - 1}), or leave via out for the bootstrap")


def apply_overrides(data: dict[str, Any], overrides: Sequence[str], former: Sequence[str] = ()) -> dict[str, Any]:
    """Set TABLE.KEY=VALUE overrides (``p2pfed run --set``) in a scenario's TOML data, and
    methods.NAME.KEY=VALUE for a method's own table. VALUE is read as a TOML value (10, 0.5, true, ['a', 'b']:
    quote strings inside lists), else taken as a string; keys are checked when the scenario is validated (a key
    of a former table, whose keys have moved, too: the check says where it went)."""
    for item in overrides:
        key, sep, value = item.partition("=")
        path = key.strip().split(".")
        # methods.NAME.KEY, data.partition.KEY (data.partition alone is the old form: load_scenario says so)
        depth = 3 if path[0] == "methods" or (path[:2] == ["data", "partition"] and len(path) == 3) else 2
        if not sep or len(path) != depth or not all(path):
            raise ConfigError(f"--set {item!r}: expected TABLE.KEY=VALUE (e.g. scenario.seed=1), "
                              f"data.partition.KEY=VALUE or methods.NAME.KEY=VALUE")
        if path[0] not in (*SCENARIO_TABLES, "methods", *former):
            raise ConfigError(f"--set {item!r}: unknown table [{path[0]}]; choose one of "
                              f"{', '.join(SCENARIO_TABLES)} or methods.NAME")
        try:
            parsed = tomllib.loads(f"v = {value.strip()}")["v"]
        except tomllib.TOMLDecodeError:
            parsed = value.strip()
        table = data.setdefault(path[0], {})
        if not isinstance(table, dict):
            raise ConfigError(f"--set {item!r}: {path[0]} in the file is not a table")
        if depth == 3:
            table = table.setdefault(path[1], {})
            if not isinstance(table, dict):
                raise ConfigError(f"--set {item!r}: {path[0]}.{path[1]} is not a table")
        table[path[-1]] = parsed
    return data


def write_scenario(data: dict[str, Any], path: Path, header: str) -> None:
    """Write scenario data as TOML (the run folder's copy of a scenario changed by --set)."""
    import tomli_w

    path.write_text("".join(f"# {line}\n" for line in header.splitlines()) + tomli_w.dumps(data))


def load_scenario(path: Path, overrides: Sequence[str] = (), former: Former | None = None) -> Scenario:
    """Read and validate a scenario TOML (with TABLE.KEY=VALUE overrides); errors name the file and key, and
    a key of a file from before 0.1 says where it went (scenario/migrate.py; former: where the keys of the former
    shared tables went, methods/former.py, which the launchers' loader passes)."""
    former = former or {}
    data = apply_overrides(read_toml(path), overrides, tables(former))
    try:
        migrate(data, former)
        flat = dict(data.pop("scenario", {}))
        for key in SCENARIO_TABLES[1:]:
            if key in data:
                flat[key] = data.pop(key)
        for key in ("events", "adversaries"):
            if key in data:  # the file's [[events]], [[adversaries]]; --set scenario.KEY=[] replaces them
                flat.setdefault(key, data.pop(key))
        if "methods" in data:  # [methods.NAME] tables (scenario.methods, the list, is in [scenario])
            flat["method_tables"] = data.pop("methods")
            if not isinstance(flat["method_tables"], dict):
                raise ConfigError("methods must be [methods.NAME] tables of a method's options (the methods to "
                                  "run are scenario.methods, in [scenario])")
        if data:
            raise ConfigError(f"unknown table [{sorted(data)[0]}]")
        partition = _partition_table(flat)
        scenario = fill(Scenario, flat, "")
        scenario.data.partition = _partition_of(partition)
        scenario.path = str(path)
        scenario.validate()
    except ConfigError as exc:
        raise ConfigError(f"{source(path, overrides)}: {exc}") from None
    return scenario


def _partition_table(flat: dict[str, Any]) -> dict[str, Any]:
    """Take the [data.partition] table out of the scenario's data (fill cannot know which partition's
    options to build)."""
    data = flat.get("data")
    if not isinstance(data, dict):
        return {}
    data = flat["data"] = dict(data)
    table = data.pop("partition", {})
    if not isinstance(table, dict):
        raise ConfigError("data.partition must be a table, [data.partition], with kind and the partition's options")
    return table


def _partition_of(table: dict[str, Any]) -> PartitionOptions:
    """A partition's options from its [data.partition] table (kind: pathological when not given); checked by
    Scenario.validate, which knows the nodes."""
    table = dict(table)
    kind = table.pop("kind", "pathological")
    if not isinstance(kind, str) or kind not in PARTITIONS:
        raise ConfigError(f"data.partition.kind must be one of {', '.join(PARTITIONS)} (got {clip(kind, 40)})")
    known = {f.name for f in dataclasses.fields(PARTITIONS[kind])}  # type: ignore[arg-type]
    others = sorted(set(table) - known)
    if others:
        raise ConfigError(f"data.partition.{others[0]} is not an option of the {kind} partition (its options: "
                          f"{', '.join(sorted(known)) or 'none'}; to change the kind with --set, give the whole "
                          f"table: --set 'data.partition={{kind = \"{kind}\"}}')")
    return fill(PARTITIONS[kind], table, "data.partition.")


def source(path: Path, overrides: Sequence[str] = ()) -> str:
    """Where a scenario's settings came from, for an error: the file, and the --set overrides (a value may
    be from there)."""
    return f"{path} with --set {' --set '.join(overrides)}" if overrides else str(path)
