"""FedAvg+ and FedProx+ (the ensemble baselines of CAM, Ma et al. 2023): K members averaged separately, their soft
vote (which is not the majority of their arg-maxes), each member trained from its own start with its own shuffles
(and μ), tasks refused unless they carry the members, and the options."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import torch
from torch import nn

from p2pfed.config import ConfigError
from p2pfed.learn.checkpoint import load_own, save_atomic
from p2pfed.learn.tasks import NEXT_TOKEN
from p2pfed.learn.train import evaluate, state_of, train_epochs
from p2pfed.methods import load_checked
from p2pfed.methods.central import Instructions, Task, Update
from p2pfed.methods.ensemble import (
    EnsembleClient,
    EnsembleOptions,
    FedAvgEnsembleServer,
    FedProxEnsembleOptions,
    FedProxEnsembleServer,
    SoftVote,
)
from p2pfed.wire import WireError
from tests.methods.fake import CPU, FakeCoordinator, FakeNode, Net, distance, vec
from tests.scenario.test_mesh_learning import shrink, write


# -- the coordinator ---------------------------------------------------------------------------------
def server(k: int = 0, nodes: tuple[str, ...] = ("a", "b")) -> FedAvgEnsembleServer:
    method = FedAvgEnsembleServer(FakeCoordinator(lambda n, t: None, dim=2), EnsembleOptions(k=k))
    asyncio.run(method.before_round(0, list(nodes)))
    return method


def members(*states: dict[str, torch.Tensor], samples: int = 1) -> Update:
    return Update(states[0], samples, extra=list(states[1:]))


def test_k_members_start_as_k_runs_would_and_travel_together_all_shared() -> None:
    ctx = FakeCoordinator(lambda n, t: None, dim=2, clusters=2)
    assert len(server().models) == 2 and len(server(k=3).models) == 3  # k = 0: the scenario's clusters
    method = server(k=3)
    assert torch.equal(method.models[0]["w"], ctx.initial["w"])  # member 0: the scenario's own start
    assert all(torch.equal(method.models[m]["w"], ctx.build(ctx.seed + m)["w"]) for m in (1, 2))  # seeds + m
    for task in (method.train_task(0, "a"), method.eval_task("a")):
        assert task.models == [method.models[m] for m in range(3)] and task.shared == 3 and task.candidates == []
        assert task.groups == []
    assert method.clusters() == {}


def test_each_member_is_the_sample_weighted_mean_of_the_participants_copies_of_it() -> None:
    method = server(k=2)
    method.aggregate(0, {"a": members(vec(1, 0), vec(0, 1)), "b": members(vec(3, 2), vec(4, 4), samples=3)})
    assert method.models[0]["w"].tolist() == [2.5, 1.5]  # (1·(1, 0) + 3·(3, 2)) / 4
    assert method.models[1]["w"].tolist() == [3.0, 3.25]  # (1·(0, 1) + 3·(4, 4)) / 4


@pytest.mark.parametrize("bad", [members(vec(9, 9)), members(vec(9, 9), vec(9, 9), vec(9, 9)),
                                 Update(None, 1)])
def test_an_update_without_exactly_the_k_members_is_left_out_whole(bad: Update) -> None:
    method = server(k=2)
    method.aggregate(0, {"a": bad, "b": members(vec(3, 2), vec(4, 4), samples=3)})
    assert method.models[0]["w"].tolist() == [3.0, 2.0] and method.models[1]["w"].tolist() == [4.0, 4.0]


def test_with_one_member_a_round_is_fedavg_and_fedprox_plus_sends_mu() -> None:
    one = server(k=1)
    one.aggregate(0, {"a": members(vec(1, 0)), "b": members(vec(3, 2), samples=3)})
    assert one.models[0]["w"].tolist() == [2.5, 1.5] and one.train_task(1, "a").instructions == Instructions()
    prox = FedProxEnsembleServer(FakeCoordinator(lambda n, t: None, dim=2), FedProxEnsembleOptions(mu=0.3))
    asyncio.run(prox.before_round(0, ["a"]))
    task = prox.train_task(0, "a")
    assert task.instructions.penalty == 0.3 and task.shared == len(task.models) == 2
    assert prox.eval_task("a").instructions.penalty == 0


def test_a_restarted_coordinator_resumes_with_the_same_members(tmp_path: Path) -> None:
    method = server(k=3)
    method.aggregate(0, {"a": members(vec(1, 0), vec(0, 1), vec(2, 2))})
    data, models = method.state()
    save_atomic({"data": json.dumps(data), "models": models}, tmp_path / "coordinator.safetensors")
    ckpt = load_own(tmp_path / "coordinator.safetensors")
    restarted = FedAvgEnsembleServer(FakeCoordinator(lambda n, t: None, dim=2), EnsembleOptions(k=3))
    restarted.restore(json.loads(ckpt["data"]), ckpt["models"])
    assert [m["w"].tolist() for m in restarted.train_task(1, "a").models] == [[1.0, 0.0], [0.0, 1.0], [2.0, 2.0]]


# -- the soft vote -----------------------------------------------------------------------------------
class Fixed(nn.Module):
    """A member that answers every input with the same class probabilities."""

    def __init__(self, probs: list[float]) -> None:
        super().__init__()
        self.logits = nn.Parameter(torch.tensor(probs).log())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.logits.expand(*x.shape[:-1], -1)


def test_the_soft_vote_takes_the_highest_mean_probability_not_the_most_arg_maxes() -> None:
    # Two members lean to class 0 a little, one is sure of class 1: the majority of arg-maxes says 0, the mean
    # probabilities (0.34, 0.66) say 1.
    votes = [[0.51, 0.49], [0.51, 0.49], [0.01, 0.99]]
    vote = SoftVote([Fixed(p) for p in votes])
    x, y = torch.zeros(4, 1), torch.ones(4, dtype=torch.long)
    out = vote(x)
    assert torch.allclose(out.exp(), torch.tensor([[0.343333, 0.656667]]).expand(4, 2), atol=1e-5)
    ev = evaluate(vote, x, y, CPU)
    assert ev.accuracy == 1.0 and ev.loss == pytest.approx(-torch.tensor(0.656667).log().item(), abs=1e-5)
    majority = torch.stack([m(x).argmax(1) for m in vote.members]).mode(0).values
    assert majority.tolist() == [0, 0, 0, 0]
    # a sequence model's (batch, positions, vocabulary) output is voted on position by position
    seq = SoftVote([Fixed(p) for p in votes])(torch.zeros(2, 5, 1))
    assert seq.shape == (2, 5, 2) and NEXT_TOKEN.predict(seq).eq(1).all()


# -- the node ----------------------------------------------------------------------------------------
def trained(node: FakeNode, start: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    model = node.new_model(start)
    train_epochs(model, node.x, node.y, epochs=2, batch_size=4, lr=0.1, seed=0, device=CPU)
    return state_of(model)


def test_a_node_trains_each_member_from_its_own_start_by_its_own_local_training() -> None:
    node = FakeNode()
    starts = [state_of(node.model), state_of(Net()), state_of(Net())]
    client = EnsembleClient(node)  # type: ignore[arg-type]
    update, choice = asyncio.run(client.train(Task("train", starts, shared=3)))
    assert choice == 0 and update.state is not None and len(update.extra) == 2 and node.fits == 3
    for start, got in zip(starts, [update.state, *update.extra], strict=True):  # each as node.fit trains it
        assert all(torch.allclose(got[k], v) for k, v in trained(node, start).items())
        assert distance(got, start) > 1e-6
    assert all(torch.equal(v, starts[0][k]) for k, v in state_of(node.model).items())  # the node's own model stays


def test_fedprox_plus_pulls_each_member_towards_its_own_start() -> None:
    node = FakeNode()
    starts = [state_of(node.model), state_of(Net())]
    client = EnsembleClient(node)  # type: ignore[arg-type]
    free, _ = asyncio.run(client.train(Task("train", starts, shared=2)))
    prox, _ = asyncio.run(client.train(Task("train", starts, Instructions(penalty=2.0), shared=2)))
    for m, start in enumerate(starts):
        plain = free.state if m == 0 else free.extra[0]
        near = prox.state if m == 0 else prox.extra[0]
        assert plain is not None and near is not None
        assert distance(near, start) < 0.5 * distance(plain, start), m


def test_the_node_evaluates_the_soft_vote_of_the_members() -> None:
    node = FakeNode()
    states = [state_of(Net()) for _ in range(3)]
    ev, choice = asyncio.run(EnsembleClient(node).evaluate(Task("eval", states, shared=3)))  # type: ignore[arg-type]
    expected = evaluate(SoftVote([node.new_model(s) for s in states]), node.x, node.y, CPU)
    assert choice == 0 and ev.loss == pytest.approx(expected.loss) and ev.accuracy == expected.accuracy


@pytest.mark.parametrize("task", [Task("train", []), Task("train", [{"w": torch.zeros(1)}]),
                                  Task("eval", [{"w": torch.zeros(1)}] * 2, shared=1)])
def test_a_node_refuses_a_task_that_does_not_carry_the_members_all_shared(task: Task) -> None:
    client = EnsembleClient(FakeNode())  # type: ignore[arg-type]
    with pytest.raises(WireError, match="ensemble members"):
        asyncio.run(client.train(task) if task.kind == "train" else client.evaluate(task))


# -- options -----------------------------------------------------------------------------------------
def scenario_file(tmp_path: Path, method: str, table: str = "", partition: str = "") -> Path:
    path = write(tmp_path, methods=f'["{method}"]')
    shrink(path, nodes=4, clusters=2, rounds=4)
    text = path.read_text()
    if partition:
        clustered = 'partition.kind = "pathological"\npartition.clusters = 2'
        text = text.replace(clustered, f'partition.kind = "{partition}"')
    path.write_text(text + f"\n[methods.{method}]\n{table}\n")
    return path


@pytest.mark.parametrize(("method", "table", "message"), [
    ("fedavg-ensemble", "k = -1", "methods.fedavg-ensemble.k must be >= 0"),
    ("fedavg-ensemble", "k = 5", "methods.fedavg-ensemble.k (5) must not exceed scenario.nodes (4)"),
    ("fedavg-ensemble", "mu = 0.1", "methods.fedavg-ensemble.mu is not a known key (known: k)"),
    ("fedprox-ensemble", "mu = -0.1", "methods.fedprox-ensemble.mu must be in [0, 1e+06] (got -0.1)"),
    ("fedprox-ensemble", "k = -1", "methods.fedprox-ensemble.k must be >= 0"),
])
def test_an_option_that_cannot_work_is_named_with_its_file_and_key(tmp_path: Path, method: str, table: str,
                                                                   message: str) -> None:
    path = scenario_file(tmp_path, method, table)
    with pytest.raises(ConfigError) as caught:
        load_checked(path)
    assert str(path) in str(caught.value) and message in str(caught.value)


def test_k_comes_from_the_table_or_the_partitions_clusters_and_a_partition_without_any_must_give_it(
        tmp_path: Path) -> None:
    assert FedProxEnsembleServer.options_from(load_checked(scenario_file(tmp_path, "fedprox-ensemble"))) == \
        FedProxEnsembleOptions(k=0, mu=0.01)
    path = scenario_file(tmp_path, "fedprox-ensemble", "k = 3\nmu = 0.5")
    assert FedProxEnsembleServer.options_from(load_checked(path)) == FedProxEnsembleOptions(k=3, mu=0.5)
    assert load_checked(scenario_file(tmp_path, "fedavg-ensemble", partition="iid")).data.clusters == 1  # K = 1
    dirichlet = scenario_file(tmp_path, "fedavg-ensemble", partition="dirichlet")
    with pytest.raises(ConfigError, match=r"methods\.fedavg-ensemble\.k must be given: the dirichlet partition has "):
        load_checked(dirichlet)
    assert FedAvgEnsembleServer.options_from(load_checked(dirichlet, ["methods.fedavg-ensemble.k=2"])).k == 2
