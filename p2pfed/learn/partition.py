"""Split a dataset over clients, deterministically from a seed, so a node on another machine that knows
the scenario derives exactly its own shard.

Each client gets train, validation (a fraction of its training shard, 20% in Rokvic et al. 2025) and test
indices; its test shard follows the same label assignment as its training shard, so test accuracy is
personalised. A partition records each client's true cluster where one exists (for ARI/NMI and the Oracle
baseline). Label skew decides which samples a client gets; feature skew (the ``feature`` partition) also gives
each client a transform of its inputs (learn/transforms.py), which its train, validation and test sets all go
through, so that its test set follows its own transform.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from p2pfed.learn.labels import LABEL_GROUPS, group_count, label_groups
from p2pfed.learn.transforms import parse


@dataclass
class Shard:
    """One client's indices into the dataset's train and test splits."""

    train: np.ndarray
    val: np.ndarray
    test: np.ndarray
    labels: list[int]
    transform: str = "none"  # how the client sees its inputs (learn/transforms.py)


@dataclass
class Partition:
    """Every client's shard and true cluster (-1 everywhere when the partition has no clusters)."""

    shards: list[Shard]
    true_cluster: list[int]

    @property
    def has_clusters(self) -> bool:
        """True when the partition was built from clusters (pathological, noisy)."""
        return any(c >= 0 for c in self.true_cluster)


def server_samples(y_train: np.ndarray, per_class: int, seed: int) -> np.ndarray:
    """The training samples a server holds, per_class of every class (all of a class with fewer), drawn with
    the scenario's seed: FedDSMIC's indicator samples (Li et al. 2022 draw 10 per class "before partitioning
    the client data"). The same draw on every machine; sorted indices into the training split."""
    gen = np.random.default_rng(seed + 7919)
    picks = [gen.choice(np.flatnonzero(y_train == c), size=min(per_class, int((y_train == c).sum())), replace=False)
             for c in range(int(y_train.max()) + 1) if (y_train == c).any()]
    return np.sort(np.concatenate(picks)) if picks else np.empty(0, np.int64)


def without(y_train: np.ndarray, held: np.ndarray) -> np.ndarray:
    """The training labels with the held samples marked -1, a label no partition deals: the partition then
    deals the rest (every partition picks samples by their label)."""
    y = np.array(y_train, copy=True)
    y[held] = -1
    return y


def _split_evenly(indices: np.ndarray, parts: int) -> list[np.ndarray]:
    return [np.asarray(p) for p in np.array_split(indices, parts)]


def _assign_by_holders(labels: np.ndarray, holders: dict[int, list[int]], n: int,
                       rng: np.random.Generator) -> list[list[np.ndarray]]:
    """Shard each label's indices equally among the clients that hold it (no sample goes to two clients)."""
    out: list[list[np.ndarray]] = [[] for _ in range(n)]
    for label, clients in holders.items():
        if not clients:
            continue
        idx = rng.permutation(np.flatnonzero(labels == label))
        for client, part in zip(clients, _split_evenly(idx, len(clients)), strict=True):
            out[client].append(part)
    return out


def _by_holders(y_train: np.ndarray, y_test: np.ndarray, client_labels: list[list[int]], true_cluster: list[int],
                val_fraction: float, rng: np.random.Generator) -> Partition:
    """Each client gets the labels it holds; a label's samples are shared equally by its holders."""
    holders: dict[int, list[int]] = {lab: [] for lab in range(_classes(y_train, y_test))}
    for i, labs in enumerate(client_labels):
        for lab in labs:
            holders[lab].append(i)
    n_clients = len(client_labels)
    train_parts = _assign_by_holders(y_train, holders, n_clients, rng)
    test_parts = _assign_by_holders(y_test, holders, n_clients, rng)
    return _finish(train_parts, test_parts, client_labels, true_cluster, val_fraction, rng)


def _drawn_by_holders(y_train: np.ndarray, y_test: np.ndarray, client_labels: list[list[int]],
                      true_cluster: list[int], per_node: int, val_fraction: float, rng: np.random.Generator
                      ) -> Partition:
    """Each client draws per_node samples of its labels' training samples (val_fraction of them to validate on),
    and test samples in the dataset's test-to-train proportion (at least one): no sample twice in one client,
    but clients that hold the same labels share samples. For meshes larger than a dataset can deal disjoint
    shards to (1,000 nodes on the digits' 1,347 training samples: 1.3 each, none to validate on).

    val_fraction of each label's training samples are kept for validation, and nobody trains on them: a
    client's validation samples in a cluster-mate's training set would make that peer's model score well on
    them (pFedLIA scores peers there) for having seen them, not for helping."""
    held = np.zeros(len(y_train), dtype=bool)
    for label in np.unique(y_train[y_train >= 0]):
        idx = rng.permutation(np.flatnonzero(y_train == label))
        held[idx[:round(val_fraction * len(idx))]] = True
    n_val = round(val_fraction * per_node)
    n_test = max(1, round(per_node * len(y_test) / max(1, len(y_train))))
    shards = []
    for labs in client_labels:
        mine = np.isin(y_train, labs)
        draws = [(np.flatnonzero(mine & ~held), per_node - n_val), (np.flatnonzero(mine & held), n_val),
                 (np.flatnonzero(np.isin(y_test, labs)), n_test)]
        train, val, test = (np.sort(rng.choice(pool, size=min(size, len(pool)), replace=False))
                            for pool, size in draws)
        shards.append(Shard(train=train, val=val, test=test, labels=sorted(labs)))
    return Partition(shards, true_cluster)


def _finish(train_parts: list[list[np.ndarray]], test_parts: list[list[np.ndarray]],
            client_labels: list[list[int]], true_cluster: list[int], val_fraction: float,
            rng: np.random.Generator) -> Partition:
    shards = []
    for i in range(len(train_parts)):
        train = rng.permutation(np.concatenate(train_parts[i]) if train_parts[i] else np.empty(0, np.int64))
        test = np.sort(np.concatenate(test_parts[i])) if test_parts[i] else np.empty(0, np.int64)
        n_val = round(val_fraction * len(train))
        shards.append(Shard(train=np.sort(train[n_val:]), val=np.sort(train[:n_val]), test=test,
                            labels=sorted(client_labels[i])))
    return Partition(shards, true_cluster)


def pathological(y_train: np.ndarray, y_test: np.ndarray, n_clients: int, n_clusters: int, seed: int,
                 val_fraction: float = 0.2, extra_labels: int = 0, extra_prob: float = 0.0,
                 groups: str = "none", per_node: int = 0) -> Partition:
    """Pathological clusters (Rokvic et al. 2025): labels split evenly over clusters, each label exclusive to one.

    With groups (learn/labels.py) the groups of labels are split evenly instead, and a cluster holds every
    label of its groups (CIFAR-100: 20 superclasses, four per cluster of five, as Rokvic et al. 2025 do). With
    extra_prob > 0 this is the noisy setting: each client, with that probability, also gets extra_labels
    random labels from outside its cluster (Rokvic et al. 2025: 0.5 and one label; five for CIFAR-100).
    Clients are assigned to clusters in contiguous blocks (client i in cluster i * C // N). A label's samples are
    dealt equally to its holders, or, with per_node > 0, each client draws that many of its labels' samples, clients
    of a cluster sharing them (_drawn_by_holders; beyond the paper, for meshes larger than the dataset).
    """
    num_classes = int(max(y_train.max(), y_test.max())) + 1
    grouped = label_groups(groups, num_classes)
    if not 1 <= n_clusters <= min(n_clients, len(grouped)):
        what = "classes" if groups == "none" else f"groups of {groups}"
        raise ValueError(f"clusters must be between 1 and min(nodes, {what}) = {min(n_clients, len(grouped))}")
    rng = np.random.default_rng(seed)
    # Groups go to clusters in their order (CIFAR-100: superclasses 0-3 to cluster 0, ...), as labels do; the
    # paper does not say which superclasses share a cluster, and a fixed order lets every machine agree.
    cluster_labels = [sorted(label for g in part for label in grouped[g])
                      for part in np.array_split(np.arange(len(grouped)), n_clusters)]
    true_cluster = [i * n_clusters // n_clients for i in range(n_clients)]
    client_labels = [list(cluster_labels[c]) for c in true_cluster]
    for i in range(n_clients):
        if extra_prob > 0 and rng.random() < extra_prob:
            outside = [lab for lab in range(num_classes) if lab not in cluster_labels[true_cluster[i]]]
            picks = rng.choice(outside, size=min(extra_labels, len(outside)), replace=False)
            client_labels[i].extend(int(p) for p in picks)
    if per_node > 0:
        return _drawn_by_holders(y_train, y_test, client_labels, true_cluster, per_node, val_fraction, rng)
    return _by_holders(y_train, y_test, client_labels, true_cluster, val_fraction, rng)


def _spread(y_train: np.ndarray, y_test: np.ndarray, props: np.ndarray, rng: np.random.Generator
            ) -> tuple[list[list[np.ndarray]], list[list[np.ndarray]], list[list[int]]]:
    """Deal each label's train and test samples over clients in the proportions props[label] (rows sum
    to 1), the test split like the train split, so every client's test labels follow its train labels."""
    num_classes, n_clients = props.shape
    train_parts: list[list[np.ndarray]] = [[] for _ in range(n_clients)]
    test_parts: list[list[np.ndarray]] = [[] for _ in range(n_clients)]
    for label in range(num_classes):
        for labels, parts in ((y_train, train_parts), (y_test, test_parts)):
            idx = rng.permutation(np.flatnonzero(labels == label))
            cuts = (np.cumsum(props[label]) * len(idx)).astype(int)[:-1]
            for client, piece in enumerate(np.split(idx, cuts)):
                parts[client].append(piece)
    client_labels = [[lab for lab in range(num_classes) if props[lab, i] * np.sum(y_train == lab) >= 1]
                     for i in range(n_clients)]
    return train_parts, test_parts, client_labels


def _classes(y_train: np.ndarray, y_test: np.ndarray) -> int:
    return int(max(y_train.max(), y_test.max())) + 1


def _blocks(n_clients: int, n_clusters: int, num_classes: int | None = None) -> list[int]:
    """Clients in contiguous blocks per cluster (client i in cluster i * K // N)."""
    limit = min(n_clients, num_classes) if num_classes else n_clients
    if not 1 <= n_clusters <= limit:
        raise ValueError(f"clusters must be between 1 and {limit}")
    return [i * n_clusters // n_clients for i in range(n_clients)]


def dirichlet(y_train: np.ndarray, y_test: np.ndarray, n_clients: int, alpha: float, seed: int,
              val_fraction: float = 0.2) -> Partition:
    """Label-Dirichlet (NIID-1 of Ye et al. 2023, the client-wise non-IID of Ma et al. 2023): each label's
    samples spread over clients with proportions ~ Dir(alpha)."""
    if alpha <= 0:
        raise ValueError("dirichlet alpha must be > 0")
    rng = np.random.default_rng(seed)
    props = rng.dirichlet([alpha] * n_clients, size=_classes(y_train, y_test))  # (classes, clients)
    train_parts, test_parts, client_labels = _spread(y_train, y_test, props, rng)
    return _finish(train_parts, test_parts, client_labels, [-1] * n_clients, val_fraction, rng)


def cluster_dirichlet(y_train: np.ndarray, y_test: np.ndarray, n_clients: int, n_clusters: int,
                      alpha_between: float, alpha_within: float, seed: int, val_fraction: float = 0.2) -> Partition:
    """The cluster-wise non-IID by Dirichlet of Ma et al. 2023 (α = (0.1, 10) there): each label spreads over
    the K clusters ~ Dir(alpha_between), then its share of a cluster over that cluster's clients
    ~ Dir(alpha_within).
    """
    if alpha_between <= 0 or alpha_within <= 0:
        raise ValueError("alpha_between and alpha_within must be > 0")
    rng = np.random.default_rng(seed)
    num_classes = _classes(y_train, y_test)
    true_cluster = _blocks(n_clients, n_clusters)
    between = rng.dirichlet([alpha_between] * n_clusters, size=num_classes)  # (classes, clusters)
    props = np.zeros((num_classes, n_clients))
    for c in range(n_clusters):
        members = [i for i, k in enumerate(true_cluster) if k == c]
        within = rng.dirichlet([alpha_within] * len(members), size=num_classes)  # (classes, members)
        props[:, members] = between[:, [c]] * within
    train_parts, test_parts, client_labels = _spread(y_train, y_test, props, rng)
    return _finish(train_parts, test_parts, client_labels, true_cluster, val_fraction, rng)


def cluster_label_dirichlet(y_train: np.ndarray, y_test: np.ndarray, n_clients: int, n_clusters: int,
                            alpha: float, seed: int, val_fraction: float = 0.2, draw: str = "per-label") -> Partition:
    """The clustered structure of Li et al. 2022: the labels are divided over C clusters (as in the pathological
    partition), and a cluster's samples spread over its clients ~ Dir(alpha).

    draw = "per-label": one draw for each label of the cluster, so clients of a cluster share a task but
    differ in their mix (smaller alpha, more different). draw = "per-cluster": one draw p_c per cluster, client
    i taking the share p_c,i of every label of its cluster, as the text of Li et al. 2022 reads ("sampling p_c ~
    Dir(α) and allocating a p_c,i proportion of the training instances of cluster c to local client i"): the
    clients of a cluster then differ in how much data they hold, not in its mix."""
    if alpha <= 0:
        raise ValueError("dirichlet alpha must be > 0")
    if draw not in DRAWS:
        raise ValueError(f"draw must be one of {', '.join(DRAWS)} (got {draw[:40]!r})")
    rng = np.random.default_rng(seed)
    num_classes = _classes(y_train, y_test)
    true_cluster = _blocks(n_clients, n_clusters, num_classes)
    props = np.zeros((num_classes, n_clients))
    for c, labels in enumerate(np.array_split(np.arange(num_classes), n_clusters)):
        members = [i for i, k in enumerate(true_cluster) if k == c]
        if draw == "per-label":
            props[np.ix_(labels, np.array(members))] = rng.dirichlet([alpha] * len(members), size=len(labels))
            continue
        # per cluster: one row, the same for every label. A small share leaves a client without data (the paper
        # does not say what it did then); as NIID-Bench's Dirichlet partition (Q. Li et al., ICDE 2022) does,
        # p_c is drawn again until every client gets MIN_SAMPLES samples of both splits.
        fewest = min(int(np.isin(y_train, labels).sum()), int(np.isin(y_test, labels).sum()))
        for _ in range(1000):
            row = rng.dirichlet([alpha] * len(members))
            if row.min() * fewest >= MIN_SAMPLES + len(labels):  # each label's cut may round one sample off
                break
        else:
            raise ValueError(f"cluster {c}: 1000 draws of Dir({alpha}) over its {len(members)} clients each left one "
                             f"with fewer than {MIN_SAMPLES} of its {fewest} samples; raise alpha or use fewer clients")
        props[np.ix_(labels, np.array(members))] = row
    train_parts, test_parts, client_labels = _spread(y_train, y_test, props, rng)
    return _finish(train_parts, test_parts, client_labels, true_cluster, val_fraction, rng)


def feature(y_train: np.ndarray, y_test: np.ndarray, n_clients: int, transforms: list[str], seed: int,
            alpha: float = 0.0, val_fraction: float = 0.2) -> Partition:
    """Feature-space clusters (the second kind of heterogeneity in Rokvic et al. 2025): len(transforms)
    clusters of clients in contiguous blocks, cluster c seeing every input through transforms[c]. With
    alpha = 0 every client holds an equal share of every label (the clusters differ in their inputs alone);
    with alpha > 0 each label also spreads over the clients ~ Dir(alpha), label skew on top of the transform
    (the mixed form)."""
    if alpha < 0:
        raise ValueError("alpha must be >= 0 (0: no label skew)")
    rng = np.random.default_rng(seed)
    num_classes = _classes(y_train, y_test)
    true_cluster = _blocks(n_clients, len(transforms))
    props = (rng.dirichlet([alpha] * n_clients, size=num_classes) if alpha > 0
             else np.full((num_classes, n_clients), 1 / n_clients))
    train_parts, test_parts, client_labels = _spread(y_train, y_test, props, rng)
    partition = _finish(train_parts, test_parts, client_labels, true_cluster, val_fraction, rng)
    for shard, cluster in zip(partition.shards, true_cluster, strict=True):
        shard.transform = transforms[cluster]
    return partition


DRAWS = ("per-label", "per-cluster")
MIN_SAMPLES = 10  # a per-cluster draw gives every client at least this many training and test samples


def nclass(y_train: np.ndarray, y_test: np.ndarray, n_clients: int, classes: int, seed: int,
           val_fraction: float = 0.2) -> Partition:
    """The client-wise non-IID by n-class of Ma et al. 2023 (n = 2 there, after McMahan et al.): each client
    gets ``classes`` labels drawn at random, and a label's samples are shared equally by the clients holding it.
    There are no clusters. A label nobody draws is left out, as random draws leave it (with 100 clients and
    two labels each, every one of 10 labels is drawn almost surely)."""
    num_classes = _classes(y_train, y_test)
    if not 1 <= classes <= num_classes:
        raise ValueError(f"classes must be in [1, {num_classes}] (got {classes})")
    rng = np.random.default_rng(seed)
    client_labels = [sorted(int(x) for x in rng.choice(num_classes, size=classes, replace=False))
                     for _ in range(n_clients)]
    return _by_holders(y_train, y_test, client_labels, [-1] * n_clients, val_fraction, rng)


def cluster_nclass(y_train: np.ndarray, y_test: np.ndarray, n_clients: int, n_clusters: int, k_cluster: int,
                   k_client: int, seed: int, val_fraction: float = 0.2) -> Partition:
    """The cluster-wise non-IID by n-class of Ma et al. 2023 ((3, 2) there): each cluster gets k_cluster
    labels, each client k_client of its cluster's labels; a label's samples are shared equally by the clients
    holding it.

    The paper draws the clusters' labels at random "ensuring a relatively balanced number of instances per
    class"; here they are dealt from one shuffled deck of all labels, reshuffled when it runs out, so every
    label serves about as many clusters as any other (and a cluster never gets a label twice).
    """
    num_classes = _classes(y_train, y_test)
    if not 1 <= k_client <= k_cluster <= num_classes:
        raise ValueError(f"need 1 <= k_client ({k_client}) <= k_cluster ({k_cluster}) <= classes ({num_classes})")
    rng = np.random.default_rng(seed)
    true_cluster = _blocks(n_clients, n_clusters)
    deck: list[int] = []
    cluster_labels = []
    for _ in range(n_clusters):
        labels: list[int] = []
        while len(labels) < k_cluster:
            if not deck:
                deck = [int(x) for x in rng.permutation(num_classes)]
            pick = next((x for x in deck if x not in labels), None)
            if pick is None:  # the rest of the deck is already in this cluster: take a fresh deck
                deck = []
                continue
            deck.remove(pick)
            labels.append(pick)
        cluster_labels.append(sorted(labels))
    client_labels = [sorted(int(x) for x in rng.choice(cluster_labels[c], size=k_client, replace=False))
                     for c in true_cluster]
    return _by_holders(y_train, y_test, client_labels, true_cluster, val_fraction, rng)


def dominant(y_train: np.ndarray, y_test: np.ndarray, n_clients: int, n_dominant: int, share: float, seed: int,
             val_fraction: float = 0.2) -> Partition:
    """NIID-2 of Ye et al. 2023: each client has n_dominant dominant classes holding `share` of its samples (the
    rest spread over the other classes), and every client about the same number of samples. The paper
    does not give the share; 0.8 is the default here. Dominant classes are dealt in turn, so each class
    dominates about as many clients as any other."""
    num_classes = _classes(y_train, y_test)
    if not 1 <= n_dominant < num_classes or not 0 < share <= 1:
        raise ValueError(f"need 1 <= dominant classes < {num_classes} and 0 < share <= 1")
    rng = np.random.default_rng(seed)
    order = rng.permutation(num_classes)
    demand = np.full((num_classes, n_clients), (1 - share) / (num_classes - n_dominant))
    for i in range(n_clients):
        for k in range(n_dominant):
            demand[order[(i * n_dominant + k) % num_classes], i] = share / n_dominant
    props = demand / demand.sum(axis=1, keepdims=True)  # every sample of a class goes to someone
    train_parts, test_parts, client_labels = _spread(y_train, y_test, props, rng)
    return _finish(train_parts, test_parts, client_labels, [-1] * n_clients, val_fraction, rng)


def missing(y_train: np.ndarray, y_test: np.ndarray, n_clients: int, n_missing: int, seed: int,
            val_fraction: float = 0.2) -> Partition:
    """NIID-3 of Ye et al. 2023 ("missing x"): each client has no sample of n_missing random classes; a class's
    samples are shared equally by the clients that have it."""
    num_classes = _classes(y_train, y_test)
    if not 0 <= n_missing < num_classes:
        raise ValueError(f"missing classes must be in [0, {num_classes})")
    rng = np.random.default_rng(seed)
    present = np.ones((num_classes, n_clients))
    for i in range(n_clients):
        present[rng.choice(num_classes, size=n_missing, replace=False), i] = 0
    for c in np.flatnonzero(present.sum(axis=1) == 0):
        present[c, rng.integers(n_clients)] = 1  # a class nobody has would be lost: one client keeps it
    props = present / present.sum(axis=1, keepdims=True)
    train_parts, test_parts, client_labels = _spread(y_train, y_test, props, rng)
    return _finish(train_parts, test_parts, client_labels, [-1] * n_clients, val_fraction, rng)


class PartitionOptions:
    """A partition's options, the scenario's ``[data.partition]`` table (``kind`` names the partition, the
    rest are its options): filled, checked (``validate``) and built into shards (``build``)."""

    kind: ClassVar[str] = ""
    transforms_inputs: ClassVar[bool] = False  # whether it gives nodes transforms of image inputs

    def validate(self, where: str, nodes: int) -> None:
        """Raise ValueError naming where + the key of a value that cannot work for this many nodes."""

    def true_clusters(self) -> int:
        """How many clusters the partition is built from (1 for IID, 0 when it has none): the K a method
        that must be given one takes when it is not told."""
        return 0

    def build(self, y_train: np.ndarray, y_test: np.ndarray, n_clients: int, seed: int,
              val_fraction: float) -> Partition:
        raise NotImplementedError


@dataclass(frozen=True)
class Clustered(PartitionOptions):
    """A partition built from clusters of clients."""

    clusters: int = 5

    def validate(self, where: str, nodes: int) -> None:
        if not 1 <= self.clusters <= nodes:
            raise ValueError(f"{where}clusters ({self.clusters}) must be between 1 and scenario.nodes ({nodes})")

    def true_clusters(self) -> int:
        return self.clusters


@dataclass(frozen=True)
class Pathological(Clustered):
    """The pathological clusters of Rokvic et al. 2025 (``pathological``); ``label_groups`` deals groups of
    labels instead of labels ("cifar100-superclasses": CIFAR-100's superclasses, as they do; see
    learn/labels.py)."""

    kind: ClassVar[str] = "pathological"

    label_groups: str = "none"
    # samples each node draws from its labels' training samples (val_fraction of them to validate on; test samples
    # in the dataset's proportion), nodes of a cluster sharing them (0: a label's samples dealt out, none shared):
    # for more nodes than the dataset has samples for (1,000 on digits)
    per_node: int = 0

    def validate(self, where: str, nodes: int) -> None:
        super().validate(where, nodes)
        if not 0 <= self.per_node <= 100_000:
            raise ValueError(f"{where}per_node must be in 0..100000 (got {self.per_node})")
        if self.label_groups == "none":
            return
        if self.label_groups not in LABEL_GROUPS:
            raise ValueError(f"{where}label_groups must be none or one of {', '.join(LABEL_GROUPS)} "
                             f"(got {self.label_groups[:40]!r})")
        if self.clusters > group_count(self.label_groups):
            raise ValueError(f"{where}clusters ({self.clusters}) must not exceed the {group_count(self.label_groups)} "
                             f"groups of {self.label_groups}")

    def build(self, y_train: np.ndarray, y_test: np.ndarray, n_clients: int, seed: int,
              val_fraction: float) -> Partition:
        return pathological(y_train, y_test, n_clients, self.clusters, seed, val_fraction,
                            groups=self.label_groups, per_node=self.per_node)


@dataclass(frozen=True)
class Noisy(Pathological):
    """The noisy clusters of Rokvic et al. 2025 (``noisy``): with probability extra_prob a client also gets
    extra_labels labels from outside its cluster (there: one; five for CIFAR-100)."""

    kind: ClassVar[str] = "noisy"

    extra_labels: int = 1
    extra_prob: float = 0.5

    def validate(self, where: str, nodes: int) -> None:
        super().validate(where, nodes)
        if self.extra_labels < 0 or not 0 <= self.extra_prob <= 1:
            raise ValueError(f"{where}extra_labels must be >= 0 and extra_prob in [0, 1] (got {self.extra_labels}, "
                             f"{self.extra_prob})")

    def build(self, y_train: np.ndarray, y_test: np.ndarray, n_clients: int, seed: int,
              val_fraction: float) -> Partition:
        return pathological(y_train, y_test, n_clients, self.clusters, seed, val_fraction, self.extra_labels,
                            self.extra_prob, self.label_groups, self.per_node)


@dataclass(frozen=True)
class Dirichlet(PartitionOptions):
    """Label-Dirichlet (``dirichlet``): each label over the clients ~ Dir(alpha)."""

    kind: ClassVar[str] = "dirichlet"

    alpha: float = 0.5

    def validate(self, where: str, nodes: int) -> None:
        if not self.alpha > 0:
            raise ValueError(f"{where}alpha must be > 0 (got {self.alpha})")

    def build(self, y_train: np.ndarray, y_test: np.ndarray, n_clients: int, seed: int,
              val_fraction: float) -> Partition:
        return dirichlet(y_train, y_test, n_clients, self.alpha, seed, val_fraction)


@dataclass(frozen=True)
class IID(PartitionOptions):
    """Every client has every label (``iid``): one cluster."""

    kind: ClassVar[str] = "iid"

    def true_clusters(self) -> int:
        return 1

    def build(self, y_train: np.ndarray, y_test: np.ndarray, n_clients: int, seed: int,
              val_fraction: float) -> Partition:
        return pathological(y_train, y_test, n_clients, 1, seed, val_fraction)


@dataclass(frozen=True)
class ClusterDirichlet(Clustered):
    """The cluster-wise non-IID by Dirichlet of Ma et al. 2023 (``cluster-dirichlet``)."""

    kind: ClassVar[str] = "cluster-dirichlet"

    alpha_between: float = 0.1
    alpha_within: float = 10.0

    def validate(self, where: str, nodes: int) -> None:
        super().validate(where, nodes)
        if not (self.alpha_between > 0 and self.alpha_within > 0):
            raise ValueError(f"{where}alpha_between and alpha_within must be > 0 (got {self.alpha_between}, "
                             f"{self.alpha_within})")

    def build(self, y_train: np.ndarray, y_test: np.ndarray, n_clients: int, seed: int,
              val_fraction: float) -> Partition:
        return cluster_dirichlet(y_train, y_test, n_clients, self.clusters, self.alpha_between, self.alpha_within,
                                 seed, val_fraction)


@dataclass(frozen=True)
class ClusterNClass(Clustered):
    """The cluster-wise non-IID by n-class of Ma et al. 2023 (``cluster-nclass``): labels per cluster and per
    client."""

    kind: ClassVar[str] = "cluster-nclass"

    k_cluster: int = 3
    k_client: int = 2

    def validate(self, where: str, nodes: int) -> None:
        super().validate(where, nodes)
        if not 1 <= self.k_client <= self.k_cluster:
            raise ValueError(f"{where}k_client must be in [1, k_cluster] (got {self.k_client}, {self.k_cluster})")

    def build(self, y_train: np.ndarray, y_test: np.ndarray, n_clients: int, seed: int,
              val_fraction: float) -> Partition:
        return cluster_nclass(y_train, y_test, n_clients, self.clusters, self.k_cluster, self.k_client, seed,
                              val_fraction)


@dataclass(frozen=True)
class ClusterLabelDirichlet(Clustered):
    """The clustered structure of Li et al. 2022 (``cluster-label-dirichlet``): ``draw`` "per-label" (one
    Dirichlet draw per label, our first reading and the default, so earlier runs stay as they were) or
    "per-cluster" (one draw per cluster, as the paper's text reads)."""

    kind: ClassVar[str] = "cluster-label-dirichlet"

    alpha: float = 0.5
    draw: str = "per-label"

    def validate(self, where: str, nodes: int) -> None:
        super().validate(where, nodes)
        if not self.alpha > 0:
            raise ValueError(f"{where}alpha must be > 0 (got {self.alpha})")
        if self.draw not in DRAWS:
            raise ValueError(f"{where}draw must be one of {', '.join(DRAWS)} (got {self.draw[:40]!r})")

    def build(self, y_train: np.ndarray, y_test: np.ndarray, n_clients: int, seed: int,
              val_fraction: float) -> Partition:
        return cluster_label_dirichlet(y_train, y_test, n_clients, self.clusters, self.alpha, seed, val_fraction,
                                       self.draw)


@dataclass(frozen=True)
class NClass(PartitionOptions):
    """The client-wise non-IID by n-class of Ma et al. 2023 (``nclass``): ``classes`` random labels per node."""

    kind: ClassVar[str] = "nclass"

    classes: int = 2

    def validate(self, where: str, nodes: int) -> None:
        if self.classes < 1:
            raise ValueError(f"{where}classes must be >= 1 (got {self.classes})")

    def build(self, y_train: np.ndarray, y_test: np.ndarray, n_clients: int, seed: int,
              val_fraction: float) -> Partition:
        return nclass(y_train, y_test, n_clients, self.classes, seed, val_fraction)


@dataclass(frozen=True)
class Dominant(PartitionOptions):
    """NIID-2 of Ye et al. 2023 (``dominant``): ``classes`` dominant classes holding ``share`` of each client's
    data."""

    kind: ClassVar[str] = "dominant"

    classes: int = 1
    share: float = 0.8

    def validate(self, where: str, nodes: int) -> None:
        if self.classes < 1 or not 0 < self.share <= 1:
            raise ValueError(f"{where}classes must be >= 1 and share in (0, 1] (got {self.classes}, {self.share})")

    def build(self, y_train: np.ndarray, y_test: np.ndarray, n_clients: int, seed: int,
              val_fraction: float) -> Partition:
        return dominant(y_train, y_test, n_clients, self.classes, self.share, seed, val_fraction)


@dataclass(frozen=True)
class Missing(PartitionOptions):
    """NIID-3 of Ye et al. 2023 (``missing``): each client has no sample of ``classes`` random classes."""

    kind: ClassVar[str] = "missing"

    classes: int = 2

    def validate(self, where: str, nodes: int) -> None:
        if self.classes < 0:
            raise ValueError(f"{where}classes must be >= 0 (got {self.classes})")

    def build(self, y_train: np.ndarray, y_test: np.ndarray, n_clients: int, seed: int,
              val_fraction: float) -> Partition:
        return missing(y_train, y_test, n_clients, self.classes, seed, val_fraction)


@dataclass(frozen=True)
class Feature(Clustered):
    """Feature-space clusters (``feature``): ``clusters`` clusters, cluster c seeing its inputs through
    ``transforms[c]`` (by default rotations by c·360/K degrees: 0, 90, 180 and 270 for K = 4, as the
    rotated-image settings of clustered FL), every label on every client unless ``alpha`` > 0 adds label
    skew ~ Dir(alpha)."""

    kind: ClassVar[str] = "feature"
    transforms_inputs: ClassVar[bool] = True

    clusters: int = 4
    transforms: tuple[str, ...] = ()
    alpha: float = 0.0

    def cluster_transforms(self) -> list[str]:
        """Each cluster's transform: the ones given, else K evenly spaced rotations."""
        if self.transforms:
            return list(self.transforms)
        return [f"rotate:{c * 360 / self.clusters:g}" if c else "none" for c in range(self.clusters)]

    def validate(self, where: str, nodes: int) -> None:
        super().validate(where, nodes)
        if self.transforms and len(self.transforms) != self.clusters:
            raise ValueError(f"{where}transforms must give one transform per cluster: {self.clusters} clusters, "
                             f"{len(self.transforms)} transforms")
        for spec in self.transforms:
            try:
                parse(spec)
            except ValueError as exc:
                raise ValueError(f"{where}transforms: {exc}") from None
        if not self.alpha >= 0:
            raise ValueError(f"{where}alpha must be >= 0 (0: no label skew; got {self.alpha})")

    def build(self, y_train: np.ndarray, y_test: np.ndarray, n_clients: int, seed: int,
              val_fraction: float) -> Partition:
        return feature(y_train, y_test, n_clients, self.cluster_transforms(), seed, self.alpha, val_fraction)


PARTITIONS: dict[str, type[PartitionOptions]] = {p.kind: p for p in (
    Pathological, Noisy, Dirichlet, IID, ClusterDirichlet, ClusterNClass, ClusterLabelDirichlet, NClass, Dominant,
    Missing, Feature)}


def make_partition(kind: str, y_train: np.ndarray, y_test: np.ndarray, n_clients: int, seed: int, *,
                   val_fraction: float = 0.2, **options: float) -> Partition:
    """Build a partition by name (see PARTITIONS) with its options by keyword."""
    if kind not in PARTITIONS:
        raise ValueError(f"unknown partition {kind!r}; choose one of {', '.join(PARTITIONS)}")
    return PARTITIONS[kind](**options).build(y_train, y_test, n_clients, seed, val_fraction)
