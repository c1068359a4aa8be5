"""Reading VGGT checkpoints strictly, and fingerprinting aggregator weights.

Only local files are read; nothing is ever downloaded.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
from pathlib import Path
from typing import Any, Iterable, Mapping

import torch
from safetensors import SafetensorError, safe_open
from torch import Tensor, nn

from janus_core.plural import plural
from janus_core.vggt.config import AggregatorConfig

AGGREGATOR_PREFIX = "aggregator."
# A reference JanusVLN checkpoint directory holds the frozen VGGT as ``vggt.aggregator.*`` next to
# the Qwen weights, merger and action head; a VGGT checkpoint holds it as ``aggregator.*``.
# Checked in this order: the first prefix any key carries selects the aggregator's keys.
AGGREGATOR_PREFIXES: tuple[str, ...] = ("vggt." + AGGREGATOR_PREFIX, AGGREGATOR_PREFIX)
# Looked up in this order inside a checkpoint directory (the index names the shards of a sharded
# safetensors checkpoint, as transformers writes big models).
SAFETENSORS_INDEX_SUFFIX = ".safetensors.index.json"
WEIGHT_FILE_NAMES: tuple[str, ...] = ("model.safetensors", "model.pt", "model.pth", "model" + SAFETENSORS_INDEX_SUFFIX)
WEIGHT_SUFFIXES: tuple[str, ...] = (".safetensors", SAFETENSORS_INDEX_SUFFIX, ".pt", ".pth")
CONFIG_FILE_NAME = "config.json"
# Bumped if the byte layout hashed by weights_fingerprint ever changes.
FINGERPRINT_SCHEME = "janus-vggt-weights-v1"
_MAX_KEYS_IN_ERROR = 10


class CheckpointError(ValueError):
    """A checkpoint that cannot be read or does not match the aggregator."""


def resolve_weights_file(path: str | os.PathLike[str]) -> Path:
    """The weights file for ``path``: the file itself, or the first of WEIGHT_FILE_NAMES in a directory."""
    path = Path(path)
    if path.is_dir():
        for name in WEIGHT_FILE_NAMES:
            if (path / name).is_file():
                return path / name
        raise CheckpointError(f"{path}: no checkpoint found; looked for {', '.join(WEIGHT_FILE_NAMES)}")
    if not path.is_file():
        raise CheckpointError(f"{path}: no such checkpoint file or directory")
    if not path.name.endswith(WEIGHT_SUFFIXES):
        raise CheckpointError(f"{path}: unsupported checkpoint format; expected one of {', '.join(WEIGHT_SUFFIXES)}")
    return path


def resolve_config(
    weights_file: Path, config: AggregatorConfig | Mapping[str, Any] | None
) -> AggregatorConfig:
    """``config`` if given, else the ``aggregator`` section of a config.json next to the weights, else VGGT-1B."""
    if config is not None:
        return config if isinstance(config, AggregatorConfig) else AggregatorConfig.from_dict(config)
    config_file = weights_file.parent / CONFIG_FILE_NAME
    if not config_file.is_file():
        return AggregatorConfig()
    try:
        data = json.loads(config_file.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{config_file}: cannot read the checkpoint config: {exc}") from exc
    section = data.get("aggregator") if isinstance(data, dict) else None
    if section is None:
        return AggregatorConfig()
    if not isinstance(section, dict):
        raise CheckpointError(f"{config_file}: 'aggregator' must be an object, got {type(section).__name__}")
    try:
        return AggregatorConfig.from_dict(section)
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"{config_file}: invalid 'aggregator' section: {exc}") from exc


def aggregator_key_map(keys: Iterable[str]) -> dict[str, str]:
    """Bare aggregator key -> key as stored, for the keys of a checkpoint.

    A reference JanusVLN state dict (any key starting with ``vggt.aggregator.``) contributes its
    ``vggt.aggregator.*`` entries, a full VGGT state dict (``aggregator.*``) its ``aggregator.*``
    entries; every other key (heads, Qwen, merger) is ignored. Without either prefix every key is
    taken as a bare aggregator key.
    """
    keys = list(keys)
    for prefix in AGGREGATOR_PREFIXES:
        if any(key.startswith(prefix) for key in keys):
            return {key.removeprefix(prefix): key for key in keys if key.startswith(prefix)}
    return {key: key for key in keys}


def safetensors_shards(weights_file: Path) -> dict[str, Path]:
    """Key -> the safetensors file holding it, for one file or the shards named by an index."""
    try:
        if not weights_file.name.endswith(SAFETENSORS_INDEX_SUFFIX):
            with safe_open(weights_file, framework="pt") as handle:
                return {key: weights_file for key in handle.keys()}
        weight_map = json.loads(weights_file.read_text())["weight_map"]
    except (OSError, SafetensorError, json.JSONDecodeError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{weights_file}: cannot read checkpoint: {exc}") from exc
    if not isinstance(weight_map, dict):
        raise CheckpointError(f"{weights_file}: 'weight_map' must map keys to shard files")
    shards = {key: weights_file.parent / str(name) for key, name in weight_map.items()}
    for shard in sorted(set(shards.values())):
        if not shard.is_file():
            raise CheckpointError(f"{weights_file}: shard {shard.name} is missing")
    return shards


def safetensors_shapes(shards: Mapping[str, Path]) -> dict[str, tuple[int, ...]]:
    """Key -> shape of every tensor of a safetensors checkpoint, from the file headers (no data read)."""
    by_file: dict[Path, list[str]] = {}
    for key, file in shards.items():
        by_file.setdefault(file, []).append(key)
    shapes: dict[str, tuple[int, ...]] = {}
    for file, file_keys in by_file.items():
        try:
            with safe_open(file, framework="pt") as handle:
                shapes.update({key: tuple(handle.get_slice(key).get_shape()) for key in file_keys})
        except (OSError, SafetensorError) as exc:
            raise CheckpointError(f"{file}: cannot read checkpoint: {exc}") from exc
    return shapes


def read_safetensors(shards: Mapping[str, Path], keys: Iterable[str], device: str | torch.device = "cpu") -> dict[str, Tensor]:
    """The tensors ``keys`` (as stored) of a safetensors checkpoint; only those are read."""
    by_file: dict[Path, list[str]] = {}
    for key in keys:
        by_file.setdefault(shards[key], []).append(key)
    tensors: dict[str, Tensor] = {}
    for file, file_keys in by_file.items():
        try:
            with safe_open(file, framework="pt", device=str(device)) as handle:
                tensors.update({key: handle.get_tensor(key) for key in file_keys})
        except (OSError, SafetensorError) as exc:
            raise CheckpointError(f"{file}: cannot read checkpoint: {exc}") from exc
    return tensors


def load_aggregator_state_dict(path: str | os.PathLike[str], device: str | torch.device = "cpu") -> dict[str, Tensor]:
    """Bare-keyed aggregator tensors of a checkpoint file or directory (shapes unchecked).

    Only the aggregator's tensors are read (safetensors) or touched (torch zip files are
    memory-mapped), so the heads of a full VGGT checkpoint cost no memory.
    """
    weights_file = resolve_weights_file(path)
    if weights_file.name.endswith((".safetensors", SAFETENSORS_INDEX_SUFFIX)):
        shards = safetensors_shards(weights_file)
        key_map = aggregator_key_map(shards)
        stored = read_safetensors(shards, key_map.values(), device)
        return {bare: stored[key] for bare, key in key_map.items()}
    try:
        state = torch.load(weights_file, map_location="cpu", weights_only=True, mmap=True)
    except (OSError, RuntimeError, SafetensorError, ValueError, EOFError, pickle.UnpicklingError) as exc:
        raise CheckpointError(f"{weights_file}: cannot read checkpoint: {exc}") from exc
    if not isinstance(state, Mapping):
        raise CheckpointError(f"{weights_file}: expected a state dict (name -> tensor), got {type(state).__name__}")
    for key, value in state.items():
        if not isinstance(key, str) or not isinstance(value, Tensor):
            raise CheckpointError(f"{weights_file}: entry {key!r} is a {type(value).__name__}, not a tensor")
    return {bare: state[stored].to(device) for bare, stored in aggregator_key_map(state).items()}


def check_state_dict(
    expected: Mapping[str, Tensor], found: Mapping[str, Tensor], source: os.PathLike[str] | str,
    what: str = "the aggregator",
) -> None:
    """Raise CheckpointError naming every missing or unexpected key and every shape mismatch
    (``what``: the module the checkpoint should match, for the message)."""
    problems = []
    missing = [key for key in expected if key not in found]
    unexpected = [key for key in found if key not in expected]
    mismatched = [
        f"{key} (checkpoint {tuple(found[key].shape)}, model {tuple(expected[key].shape)})"
        for key in expected
        if key in found and tuple(found[key].shape) != tuple(expected[key].shape)
    ]
    for label, items in (("missing key", missing), ("unexpected key", unexpected), ("shape mismatch", mismatched)):
        if items:
            shown = ", ".join(items[:_MAX_KEYS_IN_ERROR])
            more = f" and {len(items) - _MAX_KEYS_IN_ERROR} more" if len(items) > _MAX_KEYS_IN_ERROR else ""
            problems.append(f"{plural(len(items), label)}: {shown}{more}")
    if problems:
        raise CheckpointError(f"{source}: checkpoint does not match {what}: " + "; ".join(problems))


def weights_fingerprint(weights: nn.Module | Mapping[str, Tensor]) -> str:
    """sha256 (hex) over an aggregator state dict: sorted keys, dtype, shape and raw bytes.

    Independent of the file format the weights came from: a safetensors and a torch checkpoint of
    the same tensors give the same fingerprint. The dtype is part of it (a model loaded by
    ``from_pretrained`` is float32). Pass the module or a bare-keyed state dict.
    """
    state = weights.state_dict() if isinstance(weights, nn.Module) else weights
    digest = hashlib.sha256(FINGERPRINT_SCHEME.encode())
    for key in sorted(state):
        tensor = state[key].detach()
        if tensor.is_meta:
            raise ValueError(f"cannot fingerprint {key!r}: it is on the meta device (weights not loaded)")
        header = f"\n{key}\t{str(tensor.dtype).removeprefix('torch.')}\t{list(tensor.shape)}\n"
        digest.update(header.encode())
        raw = tensor.to("cpu").contiguous().reshape(-1).view(torch.uint8)
        digest.update(raw.numpy().data)
    return digest.hexdigest()
