"""A node's personalised model as a file of its own, and that file put to use.

An exported model is a safetensors file whose tensor table is the model's state dict under its own
parameter names (``safetensors.torch.load_file`` then ``load_state_dict`` is all another program needs) and
whose metadata holds the card: the architecture, the input it takes (shape, and the standardisation the
node trained with, in the units of the raw inputs), the classes or vocabulary, where it came from and the
recipe's fingerprint. ``ExportedModel`` rebuilds the model from the card and predicts:

    from p2pfed.learn.export import ExportedModel
    model = ExportedModel.load("n01-model.safetensors")
    labels = model.predict(x)          # x: raw inputs of the card's input shape, (N, C, H, W)

Inputs are refused if any is NaN or infinite, and a warning is logged when they lie far from the range of
the inputs the node trained on (the card's input_range: pixels of 0-255 given to a model of 0-16 ones).

A next-token model (``char-gru``) takes text instead: ``model.score(texts)`` gives each text's loss per
character and next-character accuracy, ``model.complete(texts)`` what the model writes after each.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import zipfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError

from p2pfed.learn.checkpoint import CheckpointError, load_with_metadata, save_atomic
from p2pfed.learn.datasets import Dataset
from p2pfed.learn.files import read_own
from p2pfed.learn.models import MODELS, SEQUENCE_MODELS, build_model
from p2pfed.learn.tasks import NEXT_TOKEN, PAD, TASKS
from p2pfed.learn.text import BOS, EOS, decode, encode_words

CARD = "p2pfed.card"  # metadata key of the card, in node checkpoints and exported models
BATCH = 1024  # texts a forward pass of score and complete takes
MAX_WIDTH = 4096  # a sequence model's positions (the longest words_per_sample sample is 271 characters): complete's
# work grows with the square of the width, and a model file may come from anyone
TAKES = "predict takes a model file written by `p2pfed export` (.safetensors)"
PICKLED = "a torch.save (pickle) file, as an earlier p2pfed's checkpoints were"

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelCard:
    """What it takes to rebuild and use a model: architecture, input, outputs, origin."""

    model: str  # learn/models.py's name of the architecture
    input_shape: tuple[int, ...]
    num_classes: int  # classes, or the vocabulary's size for next-token prediction
    task: str  # learn/tasks.py's name of the task
    input_mean: list[float] = field(default_factory=list)  # per channel, raw units; empty: inputs as given
    input_std: list[float] = field(default_factory=list)
    pixel_max: float = 0.0  # a white pixel in raw units, to read image files (0: the model takes arrays only)
    vocabulary: str = ""
    node: str = ""
    method: str = ""
    round: int = -1
    recipe: str = ""  # the recipe's fingerprint (Scenario.fingerprint, scenario/config.py)
    class_names: list[str] = field(default_factory=list)  # the recipe's data.class_names, in class order
    # [lowest, highest] value of the training inputs in raw units, to warn of inputs in other units; empty in
    # cards written before it was kept (and for text): not checked
    input_range: list[float] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str, where: str) -> ModelCard:
        """The card in text, read from where (a file's metadata); CheckpointError names what is wrong."""
        try:
            data = json.loads(text)
            data["input_shape"] = tuple(int(d) for d in data["input_shape"])
            card = cls(**data)
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise CheckpointError(f"{where}: its model card cannot be read ({str(exc)[:200]})") from None
        problem = card.problem()
        if problem:  # a model file may come from anyone: its card must not make us build something absurd
            raise CheckpointError(f"{where}: its model card {problem}")
        return card

    def problem(self) -> str:
        """What makes the card unusable ("" if nothing): unknown model, sizes out of bounds, odd statistics."""
        kinds = {"model": str, "num_classes": int, "task": str, "input_mean": list, "input_std": list,
                 "vocabulary": str, "node": str, "method": str, "round": int, "recipe": str,
                 "class_names": list, "input_range": list}
        wrong = [k for k, kind in kinds.items() if not isinstance(getattr(self, k), kind)
                 or isinstance(getattr(self, k), bool)]
        if wrong:
            return f"has fields of the wrong kind: {', '.join(wrong)}"
        size = math.prod(self.input_shape) if self.input_shape else 0
        stats = (self.input_mean, self.input_std)
        if self.model not in MODELS:
            return f"names an unknown model {self.model[:40]!r}"
        if not 1 <= len(self.input_shape) <= 4 or not all(1 <= d <= 100_000 for d in self.input_shape) \
                or size > 50_000_000:
            return f"has an input shape out of bounds: {self.input_shape[:8]}"
        if not 1 <= self.num_classes <= 1_000_000:
            return f"has {self.num_classes} classes (1 to 1000000)"
        if len(self.input_mean) != len(self.input_std) or len(self.input_mean) not in (0, self.input_shape[0], size):
            return "has standardisation statistics that do not fit its input shape"
        if not all(isinstance(v, (int, float)) and math.isfinite(v) for s in stats for v in s) \
                or any(v <= 0 for v in self.input_std):
            return "has standardisation statistics that are not finite numbers (std above 0)"
        if not (isinstance(self.pixel_max, (int, float)) and 0 <= self.pixel_max <= 1e6):
            return "has a pixel value out of bounds"
        if self.input_range and not (len(self.input_range) == 2
                                     and all(isinstance(v, (int, float)) and math.isfinite(v) for v in self.input_range)
                                     and self.input_range[0] <= self.input_range[1]):
            return "has an input range that is not two finite numbers, the lowest first"
        if len(self.class_names) > self.num_classes or not all(isinstance(n, str) and len(n) <= 200
                                                               for n in self.class_names):
            return f"has class names that are not at most {self.num_classes} names (text)"
        if self.task not in TASKS:
            return f"names an unknown task {str(self.task)[:40]!r}"
        if (self.model in SEQUENCE_MODELS) != (self.task == NEXT_TOKEN.name):
            return f"names a {self.model} for {self.task}: a sequence model is for next-token prediction, and only it"
        if self.task == NEXT_TOKEN.name and not (len(self.input_shape) == 1 and self.input_shape[0] <= MAX_WIDTH
                                                 and len(self.vocabulary) == self.num_classes
                                                 and len(set(self.vocabulary)) == len(self.vocabulary)
                                                 and BOS in self.vocabulary and EOS in self.vocabulary):
            return (f"has a vocabulary or width that does not fit its next-token model (one distinct token a class, "
                    f"start and end among them; at most {MAX_WIDTH} positions)")
        return ""

    @classmethod
    def of(cls, model: str, dataset: Dataset, class_names: Sequence[str] = (), **origin: Any) -> ModelCard:
        """The card of a model architecture trained on dataset, whose classes are class_names (the recipe's,
        if it names them; origin: node, method, round, recipe)."""
        mean, std = dataset.input_mean, dataset.input_std
        return cls(model, tuple(dataset.input_shape), dataset.num_classes, dataset.task.name,
                   mean.flatten().tolist() if mean is not None else [],
                   std.flatten().tolist() if std is not None else [], dataset.pixel_max, dataset.vocabulary,
                   class_names=list(class_names), input_range=list(dataset.input_range), **origin)


def export_model(checkpoint: Path, out: Path) -> ModelCard:
    """Write the personalised model of a node's checkpoint (NAME.safetensors, written with its card) to out;
    return its card."""
    tree, metadata = load_with_metadata(checkpoint)
    model = tree.get("model")
    if CARD not in metadata or not isinstance(model, dict) or not all(isinstance(t, torch.Tensor)
                                                                       for t in model.values()):
        raise CheckpointError(f"{checkpoint} is not a node's checkpoint with a model card (a coordinator's, or "
                              "one written before p2pfed kept cards): nothing to export")
    card = ModelCard.from_json(metadata[CARD], str(checkpoint))
    # Missing folders are made, as a run's and a node's --out are: the user named where the model goes, and a
    # mistyped folder shows as a file in a visible wrong place rather than as an export that did not happen.
    if out.parent.exists() and not out.parent.is_dir():
        raise OSError(f"{out}: {out.parent} is a file, not a folder")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OSError(f"{out}: cannot make its folder {out.parent} ({exc.strerror or exc})") from None
    try:
        save_atomic(model, out, metadata={CARD: card.to_json()})
    except (OSError, SafetensorError) as exc:
        tmp = out.with_name(out.name + ".tmp")  # save_atomic's, if it got that far
        if tmp.exists():
            tmp.unlink()
        raise OSError(f"{out}: cannot write there ({_why_not_written(exc)})") from None
    return card


def _why_not_written(exc: Exception) -> str:
    """The operating system's reason in exc ("Read-only file system"), also when safetensors wrapped it in its
    own message about a temporary file of its own."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    code = re.search(r"os error (\d+)", str(exc))
    return os.strerror(int(code[1])) if code else str(exc)[:200]


class ExportedModel:
    """An exported model, rebuilt from its card, in evaluation mode on the CPU."""

    def __init__(self, card: ModelCard, module: torch.nn.Module) -> None:
        self.card = card
        self.module = module.eval()
        # per channel (images), broadcast over the rest; or per input element (feature rows, sequences)
        per_element = len(card.input_mean) == math.prod(card.input_shape)
        dims = card.input_shape if per_element else (-1, *[1] * (len(card.input_shape) - 1))
        self.mean = torch.tensor(card.input_mean).reshape(dims) if card.input_mean else None
        self.std = torch.tensor(card.input_std).reshape(dims) if card.input_std else None

    @classmethod
    def load(cls, path: str | Path) -> ExportedModel:
        """Read an exported model (safetensors: nothing in it can run code); CheckpointError says what else the
        file is (inputs, a node's checkpoint, a pickle)."""
        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(f"{path}: no such model file ({TAKES})")
        other = _not_safetensors(path)
        if other:
            old = "; an earlier p2pfed's checkpoint becomes one by `p2pfed convert`, then `p2pfed export`"
            raise CheckpointError(f"{path} is {other}: {TAKES}{old if other == PICKLED else ''}")
        state, metadata = load_with_metadata(path)  # a plain state dict, whoever wrote the file
        if CARD not in metadata:
            raise CheckpointError(f"{path} has no model card: not a model `p2pfed export` wrote")
        if not all(isinstance(t, torch.Tensor) for t in state.values()):  # a tree: the model, its round, its method
            raise CheckpointError(f"{path} is a node's checkpoint, not an exported model: write its model with "
                                  f"`p2pfed export {path} OUT.safetensors`")
        card = ModelCard.from_json(metadata[CARD], str(path))
        module = build_model(card.model, card.input_shape, card.num_classes)
        try:
            module.load_state_dict(state)
        except (RuntimeError, TypeError) as exc:
            raise CheckpointError(f"{path}: its tensors do not fit a {card.model} for inputs "
                                  f"{card.input_shape}: {str(exc)[:300]}") from None
        return cls(card, module)

    def check(self, x: torch.Tensor) -> torch.Tensor:
        """x as a float batch of the card's input shape; ValueError naming the shapes if it is not one."""
        x = torch.as_tensor(x)
        if tuple(x.shape[1:]) != self.card.input_shape and tuple(x.shape) == self.card.input_shape:
            x = x.unsqueeze(0)  # one sample
        grey = len(self.card.input_shape) == 3 and self.card.input_shape[0] == 1
        if grey and x.dim() == 3:
            x = x.unsqueeze(1)  # grey images without their channel axis, (N, H, W)
        if tuple(x.shape[1:]) != self.card.input_shape:
            shape = ", ".join(map(str, self.card.input_shape))
            raise ValueError(f"inputs of shape {tuple(x.shape[1:])}; this {self.card.model} takes "
                             f"{self.card.input_shape} (N samples as (N, {shape}))")
        if x.is_floating_point():
            bad = ~torch.isfinite(x)
            if bool(bad.any()):  # a model answers NaN with a class all the same: refuse, where the user can look
                first, count = int(bad.reshape(len(x), -1).any(dim=1).nonzero()[0]), int(bad.sum())
                raise ValueError(f"{count} input value{'s are' if count > 1 else ' is'} NaN or infinite, the first "
                                 f"in row {first} (rows count from 0)")
        return x

    def range_warning(self, x: torch.Tensor) -> str:
        """Why raw inputs x look like they are in other units than the model's training inputs ("" if they do
        not, or the card does not say its range): a model answers them confidently, and wrongly."""
        if len(self.card.input_range) != 2 or not x.numel():
            return ""
        lo, hi = self.card.input_range
        span = hi - lo
        x_lo, x_hi = float(x.min()), float(x.max())
        # Far: past the trained range by more than its own span (0-255 for 0-16), or spread over less than a
        # tenth of it (0-16 for 0-255, 0-1 for 0-16). Inputs all of one value (a blank image) say nothing.
        if span <= 0 or not (x_lo < lo - span or x_hi > hi + span or 0 < x_hi - x_lo < span / 10):
            return ""
        return (f"inputs run from {x_lo:g} to {x_hi:g}, but this model was trained on inputs from {lo:g} to "
                f"{hi:g}: in other units? (pixels of 0-255 for 0-16 ones, say) Its answers on them may be "
                "confident and wrong")

    @torch.no_grad()
    def probabilities(self, x: torch.Tensor) -> torch.Tensor:
        """Class probabilities (N, classes) for raw inputs x, standardised as the node's data was."""
        if self.card.task != "classification":
            raise ValueError(f"this model is for {self.card.task}, not classification: no class probabilities")
        x = self.check(x).float()
        warning = self.range_warning(x)
        if warning:
            log.warning("%s", warning)
        if self.mean is not None and self.std is not None:
            x = (x - self.mean) / self.std
        return torch.softmax(self.module(x), dim=1)

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        """The most probable class of each input."""
        return self.probabilities(x).argmax(dim=1)

    # -- next-token models: text in ------------------------------------------------------------------
    def encode(self, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Texts as the model's samples (text.encode_words: x starts with the start token, y ends with the end
        token), lowercased as the node's text was; ValueError naming a text the model cannot take."""
        if self.card.task != NEXT_TOKEN.name:
            raise ValueError(f"this model is for {self.card.task}, not text: give it inputs of shape "
                             f"{self.card.input_shape}")
        letters = set(self.card.vocabulary) - {BOS, EOS}
        longest = self.card.input_shape[0] - 1  # x is the start token and the text, padded to the input width
        texts = [t.lower() for t in texts]
        for i, text in enumerate(texts, 1):
            unknown = "".join(sorted(set(text) - letters))
            if unknown:
                spaces = " (a space: this model was trained on one word a sample)" if " " in unknown else ""
                raise ValueError(f"text {i} ({text[:40]!r}): {unknown[:20]!r} not in this model's letters "
                                 f"{''.join(sorted(letters))[:80]!r}{spaces}")
            if len(text) > longest:
                raise ValueError(f"text {i} ({text[:40]!r}) has {len(text)} characters; this model takes at most "
                                 f"{longest}")
        return encode_words(texts, self.card.vocabulary, longest)

    @torch.no_grad()
    def score(self, texts: list[str]) -> list[tuple[float, float, int]]:
        """For each text: the mean cross-entropy per predicted character (nats; the end token counts, as in
        training), the share of its characters the model predicted from the ones before, and how many."""
        x, y = self.encode(texts)
        scores = []
        for start in range(0, len(x), BATCH):  # a file of many texts in batches: the logits are (N, width, V)
            out, target = self.module(x[start:start + BATCH]), y[start:start + BATCH]
            scored = target != PAD
            losses = NEXT_TOKEN.loss(out, target, reduction="none").reshape(target.shape)  # 0 at the padding
            hits = ((out.argmax(-1) == target) & scored).sum(1)
            counts = scored.sum(1)
            scores += [(float(losses[i].sum() / counts[i]), float(hits[i] / counts[i]), int(counts[i]))
                       for i in range(len(target))]
        return scores

    @torch.no_grad()
    def complete(self, texts: list[str]) -> list[str]:
        """What the model writes after each text: the most probable next character, one at a time, until it ends
        the word (or sequence) or the input width is full. The model is causal, so the padding after the
        characters so far changes nothing: a batch of texts takes at most the width's forward passes."""
        x, y = self.encode(texts)
        end = self.card.vocabulary.index(EOS)
        width = self.card.input_shape[0]
        written: list[str] = []
        for start in range(0, len(x), BATCH):
            tokens = x[start:start + BATCH].clone()
            # the start token and the text as encoded (lowercased): as many as its targets, the text and the end
            given = (y[start:start + BATCH] != PAD).sum(1)
            length = given.clone()
            going = length < width
            while bool(going.any()):
                rows = torch.nonzero(going).flatten()
                best = self.module(tokens[rows])[torch.arange(len(rows)), length[rows] - 1].argmax(-1)
                going[rows[best == end]] = False
                rows, best = rows[best != end], best[best != end]
                tokens[rows, length[rows]] = best
                length[rows] += 1
                going &= length < width
            written += [decode(tokens[i, given[i]:length[i]], self.card.vocabulary) for i in range(len(tokens))]
        return written


IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp")


def read_inputs(path: Path, card: ModelCard) -> tuple[torch.Tensor, torch.Tensor | None, list[str]]:
    """What to predict, in raw units: an .npz of x (and y, to score), an .npy of x, an image file, a folder of
    image files, or an ImageFolder (a sub-folder of images per class, as a node trains on: labels to score).
    Returns the inputs, the labels if given and a name for each input."""
    import numpy as np

    if path.suffix in (".npz", ".npy"):
        try:
            loaded = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise ValueError(f"{path}: not a readable NumPy file ({exc})") from None
        if path.suffix == ".npy":
            x, y = torch.as_tensor(loaded, dtype=torch.float32), None
        else:
            with loaded as f:
                if "x" not in f:
                    raise ValueError(f"{path}: an .npz to predict from needs an array 'x' (and may hold 'y' to score)")
                x = torch.as_tensor(f["x"], dtype=torch.float32)
                y = torch.as_tensor(f["y"], dtype=torch.int64).reshape(-1) if "y" in f else None
        if x.dim() == 0:
            raise ValueError(f"{path}: holds one number, not inputs")
        if y is not None and len(y) != len(x):
            raise ValueError(f"{path}: {len(x)} inputs but {len(y)} labels")
        return x, y, [str(i) for i in range(len(x))]
    files = sorted(p for p in path.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES) if path.is_dir() else [path]
    if path.is_dir() and not files and any(p.is_dir() for p in path.iterdir()):
        return _read_class_folders(path, card)
    if not files or any(f.suffix.lower() not in IMAGE_SUFFIXES for f in files):
        raise ValueError(f"{path}: give an .npz (x, y), an .npy, an image ({', '.join(IMAGE_SUFFIXES)}), a "
                         "folder of images or one of class folders of images")
    _takes_images(card)
    from PIL import Image

    channels, height, width = card.input_shape
    images = []
    for f in files:
        with Image.open(f) as opened:
            img = opened.convert("L" if channels == 1 else "RGB")
        if img.size != (width, height):
            raise ValueError(f"{f}: {img.size[0]}x{img.size[1]} pixels; this model takes {width}x{height}")
        array = torch.as_tensor(np.asarray(img, dtype=np.float32))
        images.append(array.unsqueeze(0) if channels == 1 else array.permute(2, 0, 1))
    return torch.stack(images) / 255.0 * card.pixel_max, None, [f.name for f in files]


def _takes_images(card: ModelCard) -> None:
    """ValueError unless the card's model was trained on images (it says how raw pixels scale)."""
    if not card.pixel_max or len(card.input_shape) != 3:
        raise ValueError(f"this model was trained on arrays of shape {card.input_shape}, not on images: give an "
                         ".npz or .npy of them")


def _read_class_folders(path: Path, card: ModelCard) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    """An ImageFolder read as a node reads its own (files.read_own), its class folders numbered by the card's
    class names (or named by number); the images in raw units, and each named by its folder and file."""
    import torchvision

    _takes_images(card)
    x, y, white = read_own(path, card.input_shape[0], card.class_names)  # OwnDataError (ValueError) says what
    if len(y) and int(y.max()) >= card.num_classes:
        raise ValueError(f"{path}: class folders run to class {int(y.max())}, but this model has {card.num_classes} "
                         f"classes (0 to {card.num_classes - 1})")
    # the same listing read_own's ImageFolder made (sorted folders, sorted files), for the names alone
    names = [Path(file).relative_to(path).as_posix() for file, _ in torchvision.datasets.ImageFolder(str(path)).samples]
    return x / white * card.pixel_max, y, names


def _not_safetensors(path: Path) -> str:
    """What path is, if it is not a safetensors file ("" if it may be one): said in place of a parser's error."""
    if path.is_dir():
        return "a folder"
    try:
        with path.open("rb") as f:
            head = f.read(9)
        size = path.stat().st_size
    except OSError as exc:
        return f"not readable ({exc.strerror or exc})"
    # safetensors: an 8-byte little-endian header length, then that many bytes of JSON
    if len(head) == 9 and int.from_bytes(head[:8], "little") <= size - 8 and head[8:9] == b"{":
        return ""
    if head.startswith(b"PK\x03\x04"):
        try:
            with zipfile.ZipFile(path) as archive:
                members = archive.namelist()
        except (zipfile.BadZipFile, OSError):
            return "a damaged zip archive"
        if members and all(m.endswith(".npy") for m in members):
            return "a NumPy .npz archive (inputs?)"
        return PICKLED if any(m.endswith("data.pkl") for m in members) else "a zip archive"
    if head.startswith(b"\x93NUMPY"):
        return "a NumPy .npy array (inputs?)"
    return PICKLED if head[:1] == b"\x80" else "not a safetensors file"


def node_checkpoints(folder: Path) -> dict[str, Path]:
    """The node checkpoints in folder by node name (not kept models, not a coordinator's)."""
    found = {}
    for path in sorted(folder.glob("*.safetensors")):
        name = path.name.removesuffix(".safetensors")
        if not name.endswith(".kept") and name != "coordinator" and not name.endswith("-model"):
            found[name] = path
    return found
