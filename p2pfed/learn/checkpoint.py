"""Crash-safe checkpoints of this machine's own state, in safetensors files: no pickle anywhere, not even
on local files (a swapped-in file can hold tensors and text, never code).

A checkpoint is a tree of dicts whose leaves are tensors or JSON values (round, method name, a method's
JSON state). The tensors go in the file's tensor table under their path (``model/fc.weight``); the rest
of the tree, with each tensor replaced by its key, goes in the file's metadata as JSON.
"""

from __future__ import annotations

import json
import os
import pickle
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

SUFFIX = ".safetensors"
_TREE = "p2pfed.tree"  # metadata key of the tree
_TENSOR = "$tensor"  # a tensor leaf in the tree: {"$tensor": key in the tensor table}


class CheckpointError(ValueError):
    """A checkpoint file this program cannot read (torn, not ours, or of an older format)."""


def save_atomic(obj: Mapping[str, Any], path: Path, metadata: Mapping[str, str] | None = None) -> None:
    """Write obj to path through a temporary file and a rename: a crash never leaves a torn file. metadata
    (text) is stored beside the tree for readers of the file (e.g. an exported model's recipe)."""
    tensors: dict[str, torch.Tensor] = {}
    tree = _flatten(obj, (), tensors, set())
    tmp = path.with_name(path.name + ".tmp")
    save_file(tensors, str(tmp), metadata={**(metadata or {}), _TREE: json.dumps(tree)})
    os.replace(tmp, path)


def load_own(path: Path) -> dict[str, Any]:
    """Read a checkpoint save_atomic wrote (tensors and JSON only: nothing in the file can run code)."""
    return load_with_metadata(path)[0]


def load_with_metadata(path: Path) -> tuple[dict[str, Any], dict[str, str]]:
    """A checkpoint's tree, its tensors in place, and the metadata stored beside it."""
    tree, tensors, metadata = read(path)
    if not isinstance(tree, dict):
        raise CheckpointError(f"{path} holds no checkpoint tree")
    return _unflatten(tree, tensors), metadata


def read(path: Path) -> tuple[Any, dict[str, torch.Tensor], dict[str, str]]:
    """The tree, the tensor table and the metadata of a safetensors file."""
    try:
        with safe_open(str(path), framework="pt") as f:
            metadata = dict(f.metadata() or {})
            tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open has no iteration)
    except (SafetensorError, OSError) as exc:
        if _is_pickle(path):
            raise CheckpointError(old_format(path)) from None
        raise CheckpointError(f"{path} is not a readable safetensors file: {exc}") from None
    if _TREE not in metadata:  # a file another tool wrote: its tensor table is the whole tree
        return {k: {_TENSOR: k} for k in tensors}, tensors, metadata
    try:
        tree = json.loads(metadata.pop(_TREE))
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{path}: its {_TREE} metadata is not JSON: {exc}") from None
    return tree, tensors, metadata


def refuse_old(path: Path) -> None:
    """Stop with old_format's message when path (a checkpoint to resume from) is missing but the file an
    earlier p2pfed wrote in its place is there: resuming would silently start that member afresh."""
    old = legacy_path(path)
    if not path.exists() and old.exists():
        raise CheckpointError(old_format(old))


def legacy_path(path: Path) -> Path:
    """Where an earlier p2pfed kept the checkpoint now at path: n01.safetensors was n01.ckpt, and
    n01.kept.safetensors was n01.kept."""
    stem = path.name.removesuffix(SUFFIX)
    return path.with_name(stem if stem.endswith(".kept") else stem + ".ckpt")


def old_format(path: Path) -> str:
    """The message for a pickled checkpoint of an earlier p2pfed."""
    return (f"{path} is a checkpoint of an earlier p2pfed (pickle format, no longer read); if you wrote it, "
            f"convert it once with: p2pfed convert {path}  (or delete it to start that member afresh)")


def convert(old: Path) -> Path:
    """Rewrite a pickled checkpoint of an earlier p2pfed (NAME.ckpt, NAME.kept) as safetensors beside it and
    return the new path. Only on the user's command, for a file they vouch for: it is unpickled, though with
    torch's weights_only loader, which admits tensors and plain containers only."""
    try:
        obj = torch.load(old, weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, OSError, EOFError) as exc:
        # torch's own text suggests weights_only=False, which would run code from the file: not ours to echo
        raise CheckpointError(f"{old}: not a checkpoint p2pfed can convert: it is not a torch file, or it holds "
                              f"more than tensors and plain data ({type(exc).__name__})") from None
    if not isinstance(obj, dict):
        raise CheckpointError(f"{old} does not hold a dict; not a p2pfed checkpoint")
    new = old.with_name((old.name if old.suffix == ".kept" else old.stem) + SUFFIX)
    save_atomic(obj, new)
    return new


def _is_pickle(path: Path) -> bool:
    """Does path start like torch.save's zip file or a raw pickle?"""
    try:
        with path.open("rb") as f:
            head = f.read(4)
    except OSError:
        return False
    return head.startswith(b"PK\x03\x04") or head[:1] == b"\x80"


def _flatten(node: Any, where: tuple[str, ...], tensors: dict[str, torch.Tensor], storages: set[int]) -> Any:
    if isinstance(node, torch.Tensor):
        key = "/".join(where)
        while key in tensors:  # two paths that join alike (a name holding "/"): keep both
            key += "'"
        tensor = node.detach().cpu()  # a no-op for what state_of gave (already a CPU copy): no copy every round
        storage = tensor.untyped_storage().data_ptr()
        if storage in storages or not tensor.is_contiguous():
            # safetensors refuses tensors that share storage (tied weights, views) and non-contiguous ones
            tensor = tensor.contiguous().clone()
        else:
            storages.add(storage)
        tensors[key] = tensor
        return {_TENSOR: key}
    if isinstance(node, Mapping):
        out = {}
        for k, v in node.items():
            if not isinstance(k, str):
                raise TypeError(f"checkpoint keys are text; {'/'.join(where) or 'the top'} has {k!r}")
            out[k] = _flatten(v, (*where, k), tensors, storages)
        return out
    if isinstance(node, (list, tuple)):
        if any(isinstance(v, (torch.Tensor, Mapping)) for v in node):
            raise TypeError(f"{'/'.join(where)}: tensors and tables go in dicts, not lists, in a checkpoint")
        return list(node)
    if node is None or isinstance(node, (str, int, float, bool)):
        return node
    raise TypeError(f"{'/'.join(where)}: a {type(node).__name__} cannot go in a checkpoint (tensors, dicts and "
                    "JSON values only)")


def _unflatten(node: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(node, dict):
        if set(node) == {_TENSOR}:
            key = node[_TENSOR]
            if key not in tensors:
                raise CheckpointError(f"the checkpoint's tree names a tensor {str(key)[:80]!r} it does not hold")
            return tensors[key]
        return {k: _unflatten(v, tensors) for k, v in node.items()}
    return node
