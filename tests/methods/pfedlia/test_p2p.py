"""pFedLIA peer to peer, without sockets: the influence phase, the choice, who sends to whom, late joiners."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import torch

from p2pfed.influence.evidence import Estimate
from p2pfed.influence.lazy_influence import score_peers
from p2pfed.learn.tasks import CLASSIFICATION
from p2pfed.methods.pfedlia.options import P2POptions, PaperP2POptions
from p2pfed.methods.pfedlia.p2p import PFedLIAP2P, PFedLIAP2PPaper
from p2pfed.wire import ModelIn, NoteIn


class FakeNode:
    """A PeerContext whose peers' partial models are given by the test (their scores: ScoredPFedLIA)."""

    def __init__(self, name: str, peers: list[str], scores: dict[str, float], keeps: dict[str, set[str]]) -> None:
        self.name, self.round, self.seed = name, 0, 0
        self.peers = peers
        self.scores = scores
        self.keeps = keeps  # peer -> kinds of kept model it can give ("w0", "partial")
        self.sent: list[tuple[str, set[str]]] = []
        self.announced: list[tuple[list[str], list[str]]] = []
        self.fetched: list[tuple[str, str]] = []
        self.records: list[tuple[str, dict[str, Any]]] = []
        self.loaded: dict[str, torch.Tensor] | None = None
        self.trained_partial = 0
        self.kept: dict[str, dict[str, torch.Tensor]] = {}
        self.rounds: dict[str, int] = {}  # the round a peer was heard to be at (peer_round)
        # what begin's look at the validation split says of w0, the mean of the choice's partial models and its
        # own partial model: mean losses and errors (the partials worse in both: it goes on from w0)
        self.start_judged = ([1.0, 2.0, 2.0], [0, 1, 1])

    def live_peers(self) -> list[str]:
        return sorted(self.peers)

    lazy = False

    def members(self) -> list[str]:
        return sorted([*self.peers, self.name])

    def gone(self, name: str) -> bool:
        return False

    def peer_round(self, name: str) -> int:
        return self.rounds.get(name, 0)

    def true_cluster_of(self, name: str) -> int:
        return -1

    async def train_copy(self, start: dict[str, torch.Tensor], samples: int, epochs: int, lr: float
                         ) -> dict[str, torch.Tensor]:
        self.trained_partial += 1
        return {"w": torch.ones(2)}

    def keep(self, models: dict[str, dict[str, torch.Tensor]]) -> None:
        self.kept.update(models)

    def kept_model(self, kind: str) -> dict[str, torch.Tensor] | None:
        return self.kept.get(kind)

    async def send_model(self, to: set[str], kind: str, state: dict[str, torch.Tensor],
                         meta: dict[str, Any] | None = None) -> int:
        self.sent.append((kind, set(to)))
        return len(to)

    async def collect(self, kind: str, rnd: int, expected: set[str], timeout: float | None
                      ) -> dict[str, ModelIn | NoteIn]:
        if kind == "partial":
            return {p: ModelIn(p, {"w": torch.full((2,), float(i))}, 1) for i, p in enumerate(sorted(expected))}
        return {p: NoteIn(p, {}) for p in expected}

    async def send_note(self, to: list[str], kind: str, values: dict[str, float]) -> int:
        assert kind == "choices"
        self.announced.append((sorted(values), list(to)))
        return len(to)

    async def fetch(self, peer: str, kind: str) -> dict[str, torch.Tensor] | None:
        self.fetched.append((peer, kind))
        return {"w": torch.zeros(2)} if kind in self.keeps.get(peer, set()) else None

    def load_state(self, state: dict[str, torch.Tensor]) -> None:
        self.loaded = state

    async def on_validation(self, judge: Any) -> Any:
        return self.start_judged

    def new_model(self, state: dict[str, torch.Tensor] | None = None) -> torch.nn.Module:
        return torch.nn.Linear(1, 1)  # the local track: not trained here

    def current_state(self) -> dict[str, torch.Tensor]:
        return {"w": torch.zeros(2)}

    def record(self, event: str, **fields: Any) -> None:
        self.records.append((event, fields))


class ScoredPFedLIA(PFedLIAP2P):
    """pFedLIA whose lazy influence of a peer is the fake node's score for it."""

    async def score(self, partials: dict[str, dict[str, torch.Tensor]]) -> dict[str, Estimate]:
        scores = self.node.scores  # type: ignore[attr-defined]
        return {p: Estimate(scores[p], scores[p], scores[p], 10) for p in partials}


SCORES = {"a": 2.0, "b": 1.9, "c": -3.0, "d": -3.1}


async def test_warm_up_averages_with_everyone_then_the_influence_phase_chooses_the_helpful_peers() -> None:
    node = FakeNode("me", list(SCORES), SCORES, {})
    method = ScoredPFedLIA(node, P2POptions(warmup_rounds=2))
    await method.before_round(1)
    assert method.sources(1) == method.subscribers(1) == set(SCORES) and node.sent == []
    await method.before_round(2)
    assert node.sent == [("partial", set(SCORES))] and node.trained_partial == 1
    assert method.chosen == {"a", "b"} and method.sources(3) == {"a", "b"}
    assert node.announced == [(["a", "b"], sorted(SCORES))] and node.records[0][1]["chosen"] == ["a", "b"]
    kept = {kind: state["w"].tolist() for kind, state in node.kept.items()}
    assert kept == {"w0": [0.0, 0.0], "partial": [1.0, 1.0]}  # w0 and its partial, kept for late joiners
    assert method.subscribers(3) == set()  # nobody chose this node yet
    method.on_note("choices", "a", 2, {"me": 0.5, "b": 0.1})
    method.on_note("choices", "c", 2, {"d": 0.3})
    assert method.subscribers(3) == {"a"}
    method.on_note("choices", "a", 3, {"b": 0.2})  # a changed its mind
    assert method.subscribers(3) == set()
    await method.before_round(3)  # once chosen, nothing more happens before a round
    assert len(node.sent) == 1 and len(node.announced) == 1


async def test_the_selection_option_picks_the_rule_and_the_paper_form_takes_the_papers_by_default() -> None:
    hurting = {"a": -0.1, "b": -0.12, "c": -5.0, "d": -5.1}  # every peer raises this node's loss
    chosen = {}
    for label, options in [("ours", P2POptions(warmup_rounds=0)), ("paper", P2POptions(warmup_rounds=0,
                                                                                      selection="paper")),
                           ("paper-form", PaperP2POptions(warmup_rounds=0))]:
        method = ScoredPFedLIA(FakeNode("me", list(hurting), hurting, {}), options)
        await method.before_round(0)
        chosen[label] = method.chosen
    assert chosen == {"ours": set(), "paper": {"a", "b"}, "paper-form": {"a", "b"}}
    assert PFedLIAP2PPaper.options_type is PaperP2POptions and PFedLIAP2PPaper.name == "pfedlia-p2p-paper"


async def test_only_live_chosen_peers_count_and_a_reappearing_peer_is_told_the_choice_again() -> None:
    node = FakeNode("me", list(SCORES), SCORES, {})
    method = ScoredPFedLIA(node, P2POptions(warmup_rounds=0))
    await method.before_round(0)
    method.on_note("choices", "b", 0, {"me": 1.0})
    node.peers = ["b", "c"]  # a has died
    assert method.sources(1) == {"b"} and method.subscribers(1) == {"b"}
    await method.on_peer_back("a")
    assert node.announced[-1] == (["a", "b"], ["a"])
    state = method.state()
    again = ScoredPFedLIA(node, P2POptions(warmup_rounds=0))
    again.restore(state)
    assert again.state() == state and again.chosen == {"a", "b"} and again.choosers == {"b"}
    assert again.report() == {"chosen": ["a", "b"]} and PFedLIAP2P(node, P2POptions()).report() == {"chosen": None}


async def test_a_late_joiner_fetches_w0_and_kept_partials_and_chooses_without_a_new_phase() -> None:
    keeps = {"a": {"partial"}, "b": {"w0", "partial"}, "c": {"w0", "partial"}, "d": {"w0", "partial"}}
    node = FakeNode("late", list(SCORES), SCORES, keeps)
    method = ScoredPFedLIA(node, P2POptions(warmup_rounds=2))
    await method.before_round(7)
    assert node.fetched[:2] == [("a", "w0"), ("b", "w0")]  # the first peer that keeps w0 gives it
    assert node.loaded is not None and node.trained_partial == 1  # it keeps its own partial for later joiners
    assert [p for p, k in node.fetched if k == "partial"] == ["a", "b", "c", "d"]
    assert method.chosen == {"a", "b"} and node.sent == []  # no influence phase of its own


async def test_a_late_joiner_that_cannot_fetch_w0_trains_alone() -> None:
    node = FakeNode("late", ["a", "b"], SCORES, {"a": {"partial"}, "b": {"partial"}})
    method = ScoredPFedLIA(node, P2POptions(warmup_rounds=2))
    await method.before_round(5)
    assert method.chosen == set() and method.sources(6) == set()
    assert node.loaded is None and node.trained_partial == 0 and node.announced == []


class Scaled(torch.nn.Module):
    """Two logits, x scaled by w: the shape of FakeNode's states ({"w": two numbers})."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.w


# Validation splits for a Scaled model at w = (t, t): w0 is t = 0 (it predicts class 0 everywhere: a tie), the
# mean of the choice's partials t = 2/3, the node's own partial t = 1. On (1, -1) labelled 0 the loss falls as t
# grows; on (-c, c) labelled 0 it rises, and every t > 0 misclassifies it; on (-1, 1) labelled 1 it falls, and
# only t = 0 misclassifies it.
SPLITS = {"both": ([[1.0, -1.0]] * 4, [0] * 4),  # better in the loss, as good in the errors
          "neither": ([[-1.0, 1.0]] * 4, [0] * 4),  # worse in both
          # the loss falls to t of about 0.4, then rises past w0's before t = 1; one error more for any t > 0
          "mean only": ([[1.0, -1.0]] * 3 + [[-1.2, 1.2]], [0, 0, 0, 0]),
          # a sure mistake costs more than w0's two unsure ones: worse in the loss, better in the errors
          "sure mistakes": ([[-1.0, 1.0]] * 2 + [[-3.0, 3.0]], [1, 1, 0])}


class Validating(FakeNode):
    """A FakeNode whose look at its validation split is real: judged with a Scaled model (SPLITS)."""

    def __init__(self, split: str, keeps: dict[str, set[str]] | None = None) -> None:
        super().__init__("me", list(SCORES), SCORES, keeps or {})
        self.x_val, self.y_val = torch.tensor(SPLITS[split][0]), torch.tensor(SPLITS[split][1])
        self.tracks: list[torch.nn.Module] = []

    async def on_validation(self, judge: Any) -> Any:
        return judge(Scaled(), self.x_val, self.y_val, torch.device("cpu"), CLASSIFICATION)

    def new_model(self, state: dict[str, torch.Tensor] | None = None) -> torch.nn.Module:
        self.tracks.append(Scaled())  # (FakeNode's model is w0: w = (0, 0), as Scaled starts)
        return self.tracks[-1]


@pytest.mark.parametrize("split", list(SPLITS))
async def test_the_cluster_rounds_start_from_the_mean_of_the_choices_partial_models_where_it_does_better_than_w0(
        split: str) -> None:
    node = Validating(split)  # its own partial w = (1, 1); the peers' a: (0, 0), b: (1, 1); w0: (0, 0)
    method = ScoredPFedLIA(node, P2POptions(warmup_rounds=2))
    await method.before_round(2)
    assert method.chosen == {"a", "b"} and len(node.tracks) == 1
    start, track = dict(node.records)["start"], node.tracks[0].w.tolist()
    if split != "neither":  # the mean of its own (1, 1), a's and b's is not worse than w0 (0, 0): it starts there
        assert node.loaded is not None and node.loaded["w"].tolist() == pytest.approx([2 / 3, 2 / 3])
        assert start["partials"] == 3
        assert (start["loss"] < start["w0_loss"]) == (split != "sure mistakes")
        assert (start["errors"] < start["w0_errors"]) == (split == "sure mistakes")
    else:  # the partials do worse than w0 on its validation split, in the loss and the errors: it keeps w0
        assert node.loaded is None and start["partials"] == 0
        assert start["loss"] > start["w0_loss"] and start["errors"] > start["w0_errors"]
    # the local track: from its own partial model unless that does worse than w0 in both
    assert track == ([0.0, 0.0] if split in ("neither", "mean only") else [1.0, 1.0])
    assert start["local"] == (track == [1.0, 1.0])
    paper = Validating("both")
    await PFedLIAP2PPaper(paper, PaperP2POptions(warmup_rounds=2)).before_round(2)
    assert paper.loaded is None and "start" not in dict(paper.records)  # the paper's: every node goes on from w0


async def test_a_late_joiner_starts_from_the_mean_of_the_partial_models_it_fetched_and_chose() -> None:
    keeps = {p: {"w0", "partial"} for p in SCORES}  # every peer keeps w0 and a partial, w = (0, 0)
    node = Validating("both", keeps)
    method = ScoredPFedLIA(node, P2POptions(warmup_rounds=2))
    await method.before_round(7)
    assert method.chosen == {"a", "b"} and node.fetched[0] == ("a", "w0")
    # w0 loaded first, then the mean of its own partial (1, 1) and a's and b's (0, 0)
    assert node.loaded is not None and node.loaded["w"].tolist() == pytest.approx([1 / 3, 1 / 3])
    assert dict(node.records)["start"]["partials"] == 3


async def test_the_lazy_influence_of_partial_models_is_scored_from_the_kept_w0_on_the_nodes_validation_split(
) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    x_val, y_val = torch.randn(20, 3), torch.randint(0, 2, (20,))
    w0 = {k: v.detach().clone() for k, v in model.state_dict().items()}
    partials = {name: {k: v + 0.1 * (i + 1) for k, v in w0.items()} for i, name in enumerate(["c", "a", "b"])}

    class Judged(FakeNode):
        async def on_validation(self, judge: Any) -> Any:
            return judge(model, x_val, y_val, torch.device("cpu"), CLASSIFICATION)

    node = Judged("me", ["a", "b", "c"], {}, {})
    node.kept["w0"] = w0
    with torch.no_grad():
        model.weight.add_(5.0)  # the node's model moved on since w0: the scores are still against w0
    expected = score_peers(model, w0, [partials[n] for n in ["a", "b", "c"]], x_val, y_val, torch.device("cpu"))
    paper = await PFedLIAP2PPaper(node, PaperP2POptions()).score(partials)
    assert list(paper) == ["a", "b", "c"] and [e.mean for e in paper.values()] == expected  # the paper's, exactly
    ours = await PFedLIAP2P(node, P2POptions()).score(partials)  # the same means, and their bounds
    assert list(ours) == ["a", "b", "c"] and [e.mean for e in ours.values()] == pytest.approx(expected, abs=1e-6)
    assert all(e.lower < e.mean < e.upper and e.samples == 20 for e in ours.values())


class MeshNode(FakeNode):
    """A FakeNode among others of a test's mesh: notes reach the other nodes' methods, a fetch gets a peer's
    partial model once that peer has kept one."""

    def __init__(self, name: str, mesh: dict[str, MeshNode], scores: dict[str, float]) -> None:
        super().__init__(name, [], scores, {})
        self.mesh = mesh
        self.method: PFedLIAP2P | None = None
        self.notes_sent = 0
        self.cfg = type("Cfg", (), {"round_timeout": 10.0})()

    def live_peers(self) -> list[str]:
        return sorted(p for p in self.mesh if p != self.name)

    def members(self) -> list[str]:
        return sorted(self.mesh)

    async def fetch(self, peer: str, kind: str) -> dict[str, torch.Tensor] | None:
        self.fetched.append((peer, kind))
        return self.mesh[peer].kept.get(kind)

    async def send_note(self, to: list[str], kind: str, values: dict[str, float]) -> int:
        self.notes_sent += len(to)
        for peer in to:
            method = self.mesh[peer].method
            assert method is not None
            method.on_note(kind, self.name, self.round, values)
        return len(to)


async def test_a_large_mesh_scores_a_sample_then_friends_of_friends_and_finds_the_clusters_at_o_n_s_transfers(
) -> None:
    """60 nodes in 4 clusters of 15, sampling above 20 members, 5 peers a step. The warm-up round's models go to
    3 aggregators, whose average every other node fetches. Then each node scores about 5 peers
    drawn with it, then those its chosen peers chose; it ends having chosen 5 or more peers of its own cluster
    and none of another, the groups of mutual choices are the true clusters, and no node asked for more than 4·5
    partial models (all pairs: 59 each) but for those that chose it."""
    from sklearn.metrics import adjusted_rand_score

    from p2pfed.influence.selection import mutual_clusters

    n, clusters, s = 60, 4, 5
    true = {f"n{i:02d}": i % clusters for i in range(n)}
    mesh: dict[str, MeshNode] = {}
    for name in true:
        scores = {p: (2.0 if true[p] == true[name] else -2.0) + 0.01 * int(p[1:]) for p in true if p != name}
        mesh[name] = MeshNode(name, mesh, scores)
    options = P2POptions(warmup_rounds=1, sample=s, all_pairs_up_to=20, probe_every=0, fallback=False)
    for node in mesh.values():
        node.method = ScoredPFedLIA(node, options)
    methods = {name: node.method for name, node in mesh.items()}
    # the draw pairs nodes both ways
    paired = {name: set(m.paired()) for name, m in methods.items() if m is not None}
    assert all(a in paired[b] for a in paired for b in paired[a])
    assert 2 <= sum(map(len, paired.values())) / n <= 2 * s
    # the warm-up round (0): each node sends its model only to the round's 3 aggregators, which average them
    states = {name: {"w": torch.full((2,), float(i))} for i, name in enumerate(true)}
    aggregators = methods["n00"].aggregators(0)  # type: ignore[union-attr]
    assert len(aggregators) == 3 and all(m is not None and m.aggregators(0) == aggregators for m in methods.values())
    for name, method in methods.items():
        assert method is not None
        assert method.subscribers(0) == set(aggregators) - {name}
        assert method.sources(0) == (set(true) - {name} if name in aggregators else set())
        arrived = {p: ModelIn(p, states[p], 1) for p in true if name in methods[p].subscribers(0)}  # type: ignore
        averaged = method.aggregate(0, ModelIn(name, states[name], 1), arrived)
        assert (averaged is None) == (name not in aggregators)
    for node in mesh.values():
        node.round = 1
    for rnd in range(1, 12):  # the nodes' rounds run together, as in a mesh
        for node in mesh.values():
            node.round = rnd
        await asyncio.gather(*(m.before_round(rnd) for m in methods.values() if m is not None))
        if rnd == 1:  # no partial pushed to every peer; those asked for before they were kept were asked again
            assert all(m is not None and m.sampling and mesh[p].sent == [] for p, m in methods.items())
            # every node started the phase from the same w0: the warm-up round's average, made or fetched
            assert all(node.loaded is not None and node.loaded["w"].tolist() == [29.5, 29.5]
                       for name, node in mesh.items() if name not in aggregators)
    for name, method in methods.items():
        assert method is not None and not method.expanding
        assert {true[p] for p in method.chosen or ()} == {true[name]} and len(method.chosen or ()) >= s, name
        callers = set(method.choosers)
        assert len({p for p, k in mesh[name].fetched if k == "partial"} - callers) <= 4 * s
    found = mutual_clusters({name: sorted(m.chosen or ()) for name, m in methods.items() if m is not None})
    assert adjusted_rand_score([true[p] for p in sorted(true)], [found[p] for p in sorted(true)]) == 1.0
    assert len({(name, p) for name, node in mesh.items() for p, _ in node.fetched}) < n * (n - 1) / 2
    # a node's choice reached the peers it named, not the whole mesh (all pairs: each tells every peer)
    assert sum(node.notes_sent for node in mesh.values()) < n * (n - 1)


async def test_a_sampling_nodes_newly_chosen_peer_is_not_waited_for_in_the_round_it_was_chosen() -> None:
    node = FakeNode("me", [f"p{i}" for i in range(30)], {f"p{i}": 1.0 for i in range(30)},
                    {f"p{i}": {"partial"} for i in range(30)})
    node.members = lambda: sorted([*node.peers, "me"])  # type: ignore[method-assign]
    node.drawn = lambda name, rnd: True  # type: ignore[attr-defined]
    node.cfg = type("Cfg", (), {"round_timeout": 1.0})()  # type: ignore[attr-defined]
    method = ScoredPFedLIA(node, P2POptions(warmup_rounds=0, sample=10, all_pairs_up_to=20, probe_every=0,
                                            fallback=False))
    await method.before_round(0)
    assert method.sampling and method.chosen and method.chosen <= set(method.paired())
    assert method.expected(0) == set() and method.expected(1) == method.chosen  # told by then
    assert node.announced == [(sorted(method.chosen), sorted(method.chosen))]  # told: only the peers it chose


async def test_a_sampling_node_waits_for_paired_peers_behind_it_while_they_move_on_and_asks_again_later() -> None:
    """Seen at 1,000 nodes on one machine: the nodes reached the influence phase up to an hour apart; more than half
    of them waited a round's timeout, had none of their paired peers' partial models (each answered "keeps no partial
    model"), chose nobody, and never asked those peers again. Here (round 2, a round's timeout of 0.4 s): "mover"
    is at round 0 and moves on a round every 0.3 s, keeping its partial model once at round 2, 0.9 s in; "stuck"
    stays at round 1 and keeps its partial only after the phase; "ready" has its partial already."""
    paired = ["mover", "ready", "stuck"]
    node = FakeNode("me", paired, dict.fromkeys(paired, 1.0), {"ready": {"partial"}})
    node.cfg = type("Cfg", (), {"round_timeout": 0.4})()  # type: ignore[attr-defined]
    node.drawn = lambda name, rnd: True  # type: ignore[attr-defined]
    node.rounds = {"stuck": 1}
    method = ScoredPFedLIA(node, P2POptions(warmup_rounds=2, sample=4, all_pairs_up_to=2, probe_every=0,
                                            fallback=False))
    method.is_large = True
    method.paired = lambda: paired  # type: ignore[method-assign]
    loop = asyncio.get_running_loop()

    def move(rnd: int) -> None:
        node.rounds["mover"] = rnd
        if rnd == 2:
            node.keeps["mover"] = {"partial"}

    for i in (1, 2):
        loop.call_later(0.3 * i, move, i)
    started = loop.time()
    await method.before_round(2)
    took = loop.time() - started
    assert method.tried == {"mover", "ready"} and method.chosen == {"mover", "ready"}
    assert method.pending == {"stuck"} and 0.6 < took < 2.5  # past one timeout (mover moved), not forever
    node.keeps["stuck"] = {"partial"}  # it trained its partial since: asked again as the next round starts
    await method.before_round(3)
    assert method.tried == set(paired) and method.pending == set() and method.chosen == set(paired)
    assert PFedLIAP2P(node, P2POptions()).pending == set()
    again = PFedLIAP2P(node, P2POptions())
    again.restore({**method.state(), "pending": ["stuck"]})
    assert again.pending == {"stuck"}


async def test_a_sampling_node_pairs_with_and_asks_the_members_it_has_not_heard_from_but_never_the_gone() -> None:
    """Seen at 1,000 nodes on one machine: a node's table held few of its peers alive while the mesh formed (the
    others known from gossip, or declared dead for not answering their introduction, most only slow to answer);
    a sample drawn from the live ones held 3.8 peers of 16, and 106 nodes drew none. A request introduces such a
    peer first (Endpoint.request); a peer heard from and then dead, or gone, is neither drawn nor asked. One that
    is not alive once asked (its introduction unanswered) is asked again the next round, not over and over for
    the phase's patience (here 5 s)."""
    members = [f"p{i}" for i in range(6)]
    node = FakeNode("me", members, dict.fromkeys(members, 1.0), {p: {"partial"} for p in members[:4]})
    node.cfg = type("Cfg", (), {"round_timeout": 0.2})()  # type: ignore[attr-defined]
    node.drawn = lambda name, rnd: True  # type: ignore[attr-defined]
    node.live_peers = lambda: ["p0", "p1"]  # type: ignore[method-assign]  # p2, p3, p4 not heard from; p5 gone
    node.gone = lambda name: name == "p5"  # type: ignore[method-assign]
    method = ScoredPFedLIA(node, P2POptions(warmup_rounds=2, sample=len(members) + 1, all_pairs_up_to=2,
                                            probe_every=0, fallback=False))  # a sample of every pair
    method.is_large = True
    assert method.paired() == ["p0", "p1", "p2", "p3", "p4"]
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert set(await method.fetch_partials(method.paired(), 5.0, behind=2)) == {"p0", "p1", "p2", "p3"}
    assert loop.time() - started < 2.5 and [p for p, kind in node.fetched if kind == "partial"].count("p4") == 1
    await method.before_round(2)
    assert method.tried == {"p0", "p1", "p2", "p3"} and method.pending == {"p4"}  # p4 keeps no partial model yet
    node.keeps["p4"] = {"partial"}
    await method.before_round(3)  # asked again, though still not heard from
    assert method.tried == {"p0", "p1", "p2", "p3", "p4"} and method.pending == set()
    assert "p5" not in {p for p, _ in node.fetched}


async def test_a_large_meshs_straggler_does_not_wait_for_warm_up_aggregators_that_are_gone() -> None:
    """A node behind the mesh asks its warm-up round's aggregators for their average. Those the membership table
    holds dead or gone are not asked (seen at 1,000 nodes: a node asked aggregators that had finished the run,
    for twice a round's timeout in each warm-up round, and ended 20 minutes after the rest); one not met yet is
    (the mesh may still be forming)."""
    members = [f"p{i:02d}" for i in range(30)]
    node = FakeNode("you", members, {}, {})
    node.members = lambda: sorted([*members, "you"])  # type: ignore[method-assign]
    node.cfg = type("Cfg", (), {"round_timeout": 0.2})()  # type: ignore[attr-defined]
    method = PFedLIAP2P(node, P2POptions(warmup_rounds=3, sample=10, all_pairs_up_to=20))
    await method.before_round(0)
    first, second = method.aggregators(0), method.aggregators(1)
    assert "you" not in first + second
    gone = set(first + second)
    node.peers = [p for p in members if p not in gone]  # not live either
    node.gone = lambda name: name in gone  # type: ignore[attr-defined]
    await method.before_round(1)
    assert node.fetched == [] and node.loaded is None  # none asked: it goes on with its own model
    # one of them not met yet (not live, not gone) is asked, and gives the average
    gone.discard(second[1])
    node.keeps[second[1]] = {"warmup-1"}
    await method.before_round(2)
    assert node.fetched == [(second[1], "warmup-1")] and node.loaded is not None


async def test_a_sampling_node_sends_to_aggregators_and_asks_recommended_peers_it_has_not_heard_from_itself(
        ) -> None:
    """Under lazy introduction ([mesh] introduce_up_to) a node hears directly from few of its peers and knows the
    rest from news: its warm-up models go to every aggregator it knows of, and a peer recommended to it is asked
    though not heard from yet (the request introduces it; Endpoint.request)."""
    members = [f"p{i:02d}" for i in range(30)]
    node = FakeNode("me", members, dict.fromkeys(members, 1.0), {p: {"partial"} for p in members})
    node.members = lambda: sorted([*members, "me"])  # type: ignore[method-assign]
    method = ScoredPFedLIA(node, P2POptions(warmup_rounds=3, sample=4, all_pairs_up_to=10))
    method.is_large = True
    aggregators = set(method.aggregators(0)) - {"me"}
    heard = [p for p in members if p not in aggregators][:5]
    node.live_peers = lambda: heard  # type: ignore[method-assign]
    assert method.subscribers(0) == set()  # eager: the aggregators it has heard from (none here)
    node.lazy = True  # type: ignore[misc]
    assert aggregators and method.subscribers(0) == aggregators
    recommended = next(p for p in members if p not in heard)
    method.chosen, method.expanding, method.recommended = set(), True, {recommended: 2}
    await method.expand(5)
    assert (recommended, "partial") in node.fetched and recommended in method.tried


async def test_a_lazy_sampling_node_with_nothing_recommended_draws_at_random_over_every_peer_it_knows(
        ) -> None:
    """Seen at 250 nodes with introduce_up_to = 64: two nodes of one cluster whose samples held only each other
    chose each other and nothing recommended them more; their random draw was over their live peers, which under
    lazy introduction are the few they introduced themselves to (mostly of other clusters), and by the last round
    only one of their cluster had chosen them: the cluster was found split in two. The eager form draws over its
    live peers, every member."""
    members = [f"p{i:02d}" for i in range(40)]
    node = FakeNode("me", members, dict.fromkeys(members, 1.0), {p: {"partial"} for p in members})
    node.members = lambda: sorted([*members, "me"])  # type: ignore[method-assign]
    heard = members[:6]
    node.live_peers = lambda: heard  # type: ignore[method-assign]
    method = ScoredPFedLIA(node, P2POptions(sample=8, all_pairs_up_to=10))
    method.is_large, method.chosen, method.expanding, method.tried = True, {"p00"}, True, {"p00"}
    node.lazy = True  # type: ignore[misc]
    await method.expand(5)
    drawn = {p for p, _ in node.fetched}
    assert len(drawn) == 8 and drawn - set(heard)  # 8 of the 39 it knows, not 5 of the live ones
    eager = FakeNode("me", members, dict.fromkeys(members, 1.0), {p: {"partial"} for p in members})
    eager.members = node.members  # type: ignore[method-assign]
    eager.live_peers = lambda: heard  # type: ignore[method-assign]
    method = ScoredPFedLIA(eager, P2POptions(sample=8, all_pairs_up_to=10))
    method.is_large, method.chosen, method.expanding, method.tried = True, {"p00"}, True, {"p00"}
    await method.expand(5)
    assert {p for p, _ in eager.fetched} == set(heard) - {"p00"}  # eager: its live peers (every member, in a mesh)


async def test_recommendations_are_known_members_only_and_a_mesh_of_all_pairs_keeps_none() -> None:
    peers = [f"p{i}" for i in range(30)]
    node = FakeNode("me", peers, {}, {})
    node.members = lambda: sorted([*node.peers, "me"])  # type: ignore[method-assign]
    sampling = PFedLIAP2P(node, P2POptions(sample=4, all_pairs_up_to=10))
    sampling.on_note("choices", "p1", 5, {"me": 1.0, "p2": 0.5, **{f"made-up-{i}": 0.1 for i in range(2000)}})
    assert sampling.recommended == {"p1": 1, "p2": 1} and sampling.choosers == {"p1"}
    small = PFedLIAP2P(node, P2POptions(sample=4, all_pairs_up_to=100))  # 31 members: all pairs
    state = small.state()
    small.on_note("choices", "p1", 5, {"me": 1.0, "p2": 0.5})
    assert small.recommended == {} and {**small.state(), "choosers": []} == state  # only who chose it changed


async def test_a_peer_left_out_when_a_sampling_node_chooses_again_may_still_send_that_rounds_model() -> None:
    peers = [f"p{i}" for i in range(30)]
    node = FakeNode("me", peers, {}, {})
    node.members = lambda: sorted([*node.peers, "me"])  # type: ignore[method-assign]
    method = PFedLIAP2P(node, P2POptions(sample=4, all_pairs_up_to=10, probe_every=0, fallback=False))
    method.is_large = True  # a large mesh: it samples
    await method.choose({"p1": Estimate(2.0, 1.5, 2.5, 10), "p2": Estimate(1.9, 1.4, 2.4, 10),
                         "p6": Estimate(-2.0, -2.5, -1.5, 10)})
    assert method.chosen == {"p1", "p2"}
    node.round = 7
    # two far better peers found: the split now leaves p1 and p2 below it
    await method.choose({**method.estimates, "p3": Estimate(10.0, 9.5, 10.5, 10), "p5": Estimate(10.1, 9.6, 10.6, 10)})
    assert method.chosen == {"p3", "p5"} and method.since == {"p1": 0, "p2": 0, "p3": 7, "p5": 7}
    assert method.accepts("model", "p1", 7) and method.accepts("model", "p2", 7)  # they may have sent already
    assert not method.accepts("model", "p6", 7)


async def test_a_mesh_of_all_pairs_decides_nothing_its_round_loop_would_checkpoint_in_a_warm_up_round() -> None:
    """The round loop checkpoints a state changed by before_round as a decision: a warm-up round of a mesh of all
    pairs changes none (a large mesh's changes once, as its first round starts: it decided to sample)."""
    node = FakeNode("me", list(SCORES), SCORES, {})
    node.members = lambda: sorted([*node.peers, "me"])  # type: ignore[method-assign]
    method = ScoredPFedLIA(node, P2POptions(warmup_rounds=2))
    before = method.state()
    await method.before_round(0)
    assert method.state() == before and method.is_large is False


async def test_a_node_that_validates_on_one_sample_chooses_by_the_mean_as_the_paper_does() -> None:
    """One validation sample bounds nothing (every bound infinite): all peers would be left out for good."""
    node = FakeNode("me", list(SCORES), SCORES, {})
    method = PFedLIAP2P(node, P2POptions())
    inf = float("inf")
    await method.choose({p: Estimate(v, -inf, inf, 1) for p, v in SCORES.items()})
    assert method.chosen == {"a", "b"}
    sure = PFedLIAP2P(node, P2POptions())  # two samples or more: the bounds decide, as before
    await sure.choose({p: Estimate(v, -inf if p == "a" else v - 0.1, inf, 2) for p, v in SCORES.items()})
    assert sure.chosen == {"b"}
