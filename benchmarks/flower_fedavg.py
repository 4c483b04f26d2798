"""Flower's side of benchmarks/flower.py: the same FedAvg workload as `p2pfed run` under Flower's simulation
engine (Ray), run as its own process by that benchmark with the Python that has flwr (`pip install -e .[bench]`).

The workload is p2pfed's, taken from the scenario, not re-implemented: the dataset and partition
(launch/runner.py: prepare_data, local_data), the initial model (the scenario's seed), each client's local
training (learn/train.py: train_epochs, seeded as a p2pfed node's round is) and evaluation, and the clients drawn
each round (methods/central.py: participates, the hash every p2pfed coordinator draws with). What is Flower's
is what the benchmark compares: the engine that carries the models (Ray actors, Flower's messages) and FedAvg's
aggregation (flwr.serverapp.strategy.FedAvg, weighted by each client's sample count).

Run: python benchmarks/flower_fedavg.py SCENARIO OUT.json [--set TABLE.KEY=VALUE ...] [--client-cpus 1]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict  # noqa: E402
from flwr.clientapp import ClientApp  # noqa: E402
from flwr.serverapp import Grid, ServerApp  # noqa: E402
from flwr.serverapp.strategy import FedAvg  # noqa: E402
from flwr.simulation import run_simulation  # noqa: E402

from p2pfed.launch.runner import SHARED_DATA, local_data, prepare_data  # noqa: E402
from p2pfed.learn.models import build_model  # noqa: E402
from p2pfed.learn.train import evaluate, round_seed, state_of, train_epochs  # noqa: E402
from p2pfed.methods.central import participates  # noqa: E402
from p2pfed.scenario.config import Scenario, load_scenario  # noqa: E402


def scenario() -> Scenario:
    return load_scenario(Path(os.environ["P2PFED_BENCH_SCENARIO"]),
                         json.loads(os.environ.get("P2PFED_BENCH_OVERRIDES", "[]")))


_actor: dict[str, Any] = {}


def actor_state() -> dict[str, Any]:
    """What one Ray actor keeps across the clients it runs: the scenario, the dataset (mapped from the copy the
    driver wrote, as p2pfed's node processes map the runner's) and partition, the shards it has cut, a model to
    train in."""
    if not _actor:
        s = scenario()
        dataset, partition = prepare_data(s)
        _actor.update(scenario=s, dataset=dataset, partition=partition, shards={},
                      model=build_model(s.train.model, dataset.input_shape, dataset.num_classes, seed=s.seed))
    return _actor


def shard(pid: int) -> Any:
    a = actor_state()
    if pid not in a["shards"]:
        a["shards"][pid] = local_data(a["scenario"], pid, a["dataset"], a["partition"])
    return a["shards"][pid]


client = ClientApp()


@client.query()
def query(msg: Message, context: Context) -> Message:
    """The client's partition, asked once at the start (Flower's node ids are random). The actor loads its data
    now, before the first round, as a p2pfed node process does before it joins."""
    shard(int(context.node_config["partition-id"]))
    return Message(RecordDict({"metrics": MetricRecord({"partition": int(context.node_config["partition-id"])})}),
                   reply_to=msg)


@client.train()
def train(msg: Message, context: Context) -> Message:
    import torch

    pid = int(context.node_config["partition-id"])
    a, data = actor_state(), shard(pid)
    s, model = a["scenario"], a["model"]
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    rnd = int(msg.content["config"]["server-round"]) - 1  # p2pfed counts rounds from 0
    loss = train_epochs(model, data.x_train, data.y_train, epochs=s.train.epochs, batch_size=s.train.batch_size,
                        lr=s.train.lr, momentum=s.train.momentum, weight_decay=s.train.weight_decay,
                        steps=s.train.steps, seed=round_seed(s.seed, pid, rnd), device=torch.device("cpu"))
    metrics = MetricRecord({"train_loss": float(loss), "num-examples": len(data.y_train)})
    return Message(RecordDict({"arrays": ArrayRecord(state_of(model)), "metrics": metrics}), reply_to=msg)


@client.evaluate()
def evaluate_client(msg: Message, context: Context) -> Message:
    import torch

    pid = int(context.node_config["partition-id"])
    a, data = actor_state(), shard(pid)
    model = a["model"]
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    ev = evaluate(model, data.x_test, data.y_test, torch.device("cpu"))
    metrics = MetricRecord({"accuracy": float(ev.accuracy), "loss": float(ev.loss), "partition": pid,
                            "num-examples": int(ev.samples)})
    return Message(RecordDict({"metrics": metrics}), reply_to=msg)


class DrawnFedAvg(FedAvg):
    """Flower's FedAvg, training each round the clients a p2pfed coordinator draws, evaluating all of them,
    and timing each round."""

    def __init__(self, s: Scenario, partition_of: dict[int, int], times: dict[str, Any]) -> None:
        super().__init__(fraction_train=s.train.participation, fraction_evaluate=1.0,
                         min_available_nodes=s.nodes)
        self.s, self.partition_of, self.times = s, partition_of, times

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
                        ) -> Iterable[Message]:
        self.times["round_start"].append(time.time())
        drawn = [node for node, pid in self.partition_of.items()
                 if participates(self.s.seed, self.s.node_name(pid), server_round - 1, self.s.train.participation)]
        config["server-round"] = server_round
        record = RecordDict({self.arrayrecord_key: arrays, self.configrecord_key: config})
        return self._construct_messages(record, sorted(drawn), "train")

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        replies = list(replies)
        accuracy = {int(r.content["metrics"]["partition"]): float(r.content["metrics"]["accuracy"])
                    for r in replies if r.has_content()}
        samples = {int(r.content["metrics"]["partition"]): int(r.content["metrics"]["num-examples"])
                   for r in replies if r.has_content()}
        self.times["round_end"].append(time.time())
        self.times["accuracy"] = accuracy
        self.times["samples"] = samples
        return super().aggregate_evaluate(server_round, replies)


def server_app(s: Scenario, times: dict[str, Any]) -> ServerApp:
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        while len(nodes := list(grid.get_node_ids())) < s.nodes:
            time.sleep(0.1)
        replies = grid.send_and_receive([Message(RecordDict({"config": ConfigRecord({})}), message_type="query",
                                                 dst_node_id=n) for n in nodes])
        partition_of = {r.metadata.src_node_id: int(r.content["metrics"]["partition"]) for r in replies}
        dataset, _ = prepare_data(s)
        initial = state_of(build_model(s.train.model, dataset.input_shape, dataset.num_classes, seed=s.seed))
        DrawnFedAvg(s, partition_of, times).start(grid=grid, initial_arrays=ArrayRecord(initial),
                                                  num_rounds=s.rounds)

    return app


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenario", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--client-cpus", type=float, default=1.0,
                        help="Ray CPUs per client actor (1: one actor a core)")
    args = parser.parse_args()
    os.environ["P2PFED_BENCH_SCENARIO"] = str(args.scenario.resolve())
    os.environ["P2PFED_BENCH_OVERRIDES"] = json.dumps(args.overrides)  # the Ray actors inherit the environment
    s = scenario()
    # one copy of the dataset for the actors to map, as `p2pfed run` writes one for its node processes: memory
    # and start-up then compare the engines, not two ways of loading data (flwr-datasets maps its Arrow files too)
    shared = Path(tempfile.mkdtemp(prefix="flower-data-"))
    prepare_data(s, share_to=shared)
    os.environ[SHARED_DATA] = str(shared)
    times: dict[str, Any] = {"launched": float(os.environ.get("P2PFED_BENCH_LAUNCHED", time.time())),
                             "round_start": [], "round_end": []}
    run_simulation(server_app(s, times), client, num_supernodes=s.nodes,
                   backend_config={"client_resources": {"num_cpus": args.client_cpus, "num_gpus": 0.0},
                                   "init_args": {"include_dashboard": False, "logging_level": "error",
                                                 # a cluster of its own, as p2pfed's Ray engine starts: without it
                                                 # Ray joins the last cluster this machine started (its address is
                                                 # kept in /tmp/ray), and where that one is gone, Flower hangs
                                                 "address": "local"}})
    times["finished"] = time.time()
    shutil.rmtree(shared, ignore_errors=True)
    args.out.write_text(json.dumps(times) + "\n")
    return 0


if __name__ == "__main__":
    # Ray's workers must import this file as a module, as `flwr run` imports an app's: functions of __main__
    # travel pickled by value with a fresh copy of the module's globals, so each message would load the data anew.
    here = str(Path(__file__).resolve().parent)
    sys.path.insert(0, here)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (here, str(ROOT), os.environ.get("PYTHONPATH")) if p)
    import flower_fedavg

    sys.exit(flower_fedavg.main())
