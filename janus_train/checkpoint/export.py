"""Export a ZeRO-3 checkpoint as consolidated weights, in one of two formats
(:data:`~janus_train.model.export_formats.FORMATS`).

``janus``: ``<out>/`` becomes a transformers-5 directory of the run's base (config, tokenizer,
processor settings, safetensors) that the base's own class loads
(``Qwen2_5_VLForConditionalGeneration`` or ``Qwen3VLForConditionalGeneration.from_pretrained``,
DeepStack mergers included), plus ``janus_heads.safetensors`` with the VGGT merger and the action
head, which ``load_exported`` puts back on a JanusVLNModel.

``janusvln``: ``<out>/`` becomes a reference JanusVLN checkpoint directory (transformers-4.50
config with the JanusVLN fields, one state dict with the frozen VGGT encoder included), which the
reference evaluation loads and ``init_from`` reads back (:mod:`janus_train.checkpoint.reference`).
That layout is Qwen2.5-VL's: a run on another base is refused in one line.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterable
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from janus_core.bases import base_of_qwen_dir
from janus_core.dtypes import TORCH_DTYPES
from janus_core.profile import Profile
from janus_core.system.disk_space import export_room
from janus_core.system.file_modes import give_umask_modes
from janus_core.vggt import CheckpointError, VGGTAggregator
from janus_core.vggt.encoder import load_aggregator
from janus_train.checkpoint.reference import (
    read_reference_config,
    reference_config_dict,
    run_model_config,
    write_reference_checkpoint,
)
from janus_train.config import TrainSettings
from janus_train.model.export_formats import JANUSVLN, JANUSVLN_BASE
from janus_train.model.janus_model import JanusModelConfig, JanusVLNModel, aggregator_config, vggt_feature_dim

HEADS_FILE = "janus_heads.safetensors"
# Files of the base model directory the janus export copies as they are (transformers 5 reads them;
# the janusvln export writes the reference's 4.50 form instead, janus_train.checkpoint.reference_tokenizer).
TOKENIZER_FILES: tuple[str, ...] = (
    "tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "chat_template.json", "special_tokens_map.json",
    "preprocessor_config.json", "vocab.json", "merges.txt", "generation_config.json",
)
QWEN_PREFIX = "qwen."


def tensor_bytes(tensors: Iterable[torch.Tensor], dtype: torch.dtype) -> int:
    """Bytes of ``tensors`` stored as ``dtype`` (what an export writes, less small metadata); a
    tensor shared by tied weights counts once."""
    unique = {(t.data_ptr(), t.numel()): t.numel() for t in tensors}
    return sum(unique.values()) * dtype.itemsize


def consolidated_state_dict(checkpoint_dir: Path, tag: str | None = None) -> dict[str, torch.Tensor]:
    """Full fp32 state dict of the JanusVLNModel from a ZeRO-3 checkpoint (no process group needed)."""
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    state = get_fp32_state_dict_from_zero_checkpoint(str(checkpoint_dir), tag=tag)
    return {k: v.contiguous() for k, v in state.items()}


def export(checkpoint_dir: Path, out: Path, profile: Profile, config: JanusModelConfig,
           tag: str | None = None, dtype: str | None = None) -> Path:
    """Write ``out`` from the checkpoint (latest tag unless ``tag``) in ``dtype`` (default: the profile's)."""
    torch_dtype = TORCH_DTYPES[dtype or profile.compute_dtype]
    state = consolidated_state_dict(checkpoint_dir, tag)
    qwen_state = {k[len(QWEN_PREFIX):]: v.to(torch_dtype) for k, v in state.items() if k.startswith(QWEN_PREFIX)}
    heads = {k: v.to(torch_dtype) for k, v in state.items() if not k.startswith(QWEN_PREFIX)}
    model = JanusVLNModel.from_profile(profile, config, live=False, device="cpu")
    expected_heads = {k for k in model.state_dict() if not k.startswith(QWEN_PREFIX)}
    if set(heads) != expected_heads:
        raise ValueError(f"{checkpoint_dir}: head keys {sorted(set(heads) ^ expected_heads)} do not match the model")
    started = time.time() - 1  # file systems that keep mtimes in whole seconds
    with export_room(out, tensor_bytes(state.values(), torch_dtype), checkpoint_dir.parent):
        out.mkdir(parents=True, exist_ok=True)
        model.qwen.to(torch_dtype).save_pretrained(str(out), state_dict=qwen_state, safe_serialization=True)
        for name in TOKENIZER_FILES:
            if (profile.qwen.path / name).is_file():
                shutil.copyfile(profile.qwen.path / name, out / name)  # new file: the user's umask, mtime now
        save_file(heads, str(out / HEADS_FILE), metadata={"lam": str(config.lam)})
        give_umask_modes(out, started)  # safetensors writes 0600: others on a shared cluster read exports too
    return out


def export_janusvln(checkpoint_dir: Path, out: Path, profile: Profile, settings: TrainSettings, vggt: Path | None,
                    tag: str | None = None, dtype: str | None = None) -> Path:
    """Write ``out`` as a reference JanusVLN checkpoint directory from the run's checkpoint (latest
    tag unless ``tag``) in ``dtype`` (default: the profile's), with the VGGT encoder read from
    ``vggt`` (a VGGT checkpoint or a reference directory; the profile's encoder architecture), or,
    when None, the profile's own encoder (its seeded random weights when it names no checkpoint:
    the encoder its caches were made with). A run on another base than Qwen2.5-VL is refused."""
    from transformers import Qwen2_5_VLConfig

    base = base_of_qwen_dir(profile.qwen.path)
    if base is not JANUSVLN_BASE:
        raise ValueError(f"--format janusvln writes JanusVLN's reference checkpoint layout, which is {JANUSVLN_BASE.name} "
                         f"only, but this run's base ({profile.qwen.path}) is {base.name}; export it with --format janus")
    torch_dtype = TORCH_DTYPES[dtype or profile.compute_dtype]
    try:
        encoder = (load_aggregator(profile.vggt, profile.cache.attention) if vggt is None
                   else VGGTAggregator.from_pretrained(vggt, config=aggregator_config(profile.vggt)))
    except CheckpointError as exc:
        raise ValueError(f"--vggt: {exc}") from exc
    if settings.init_from is not None:
        qwen_config = read_reference_config(settings.init_from).qwen
    else:
        qwen_config = Qwen2_5_VLConfig.from_pretrained(str(profile.qwen.path), local_files_only=True)
    state = consolidated_state_dict(checkpoint_dir, tag)
    config = reference_config_dict(qwen_config, run_model_config(settings), profile.cache.reference_frame,
                                   settings.loss_config(), dtype or profile.compute_dtype)
    encoder_state = encoder.state_dict()
    started = time.time() - 1  # as export()
    with export_room(out, tensor_bytes([*state.values(), *encoder_state.values()], torch_dtype), checkpoint_dir.parent):
        write_reference_checkpoint(out, state, encoder_state, config, profile.qwen.path, torch_dtype)
        give_umask_modes(out, started)  # as export()
        return out


def export_as(fmt: str, checkpoint_dir: Path, out: Path, profile: Profile, settings: TrainSettings,
              vggt: Path | None = None, tag: str | None = None, dtype: str | None = None) -> Path:
    """Write ``out`` in format ``fmt`` (:data:`~janus_train.model.export_formats.FORMATS`) from the run's checkpoint (latest tag unless
    ``tag``): :func:`export_janusvln` (with ``vggt``) or :func:`export`."""
    if fmt == JANUSVLN:
        return export_janusvln(checkpoint_dir, out, profile, settings, vggt, tag=tag, dtype=dtype)
    return export(checkpoint_dir, out, profile, run_model_config(settings), tag=tag, dtype=dtype)


def load_exported(out: Path, profile: Profile, config: JanusModelConfig, device: str = "cpu") -> JanusVLNModel:
    """A JanusVLNModel whose Qwen part transformers loaded from ``out`` (the class of the base its
    config names) and whose heads come from it too."""
    model_class = base_of_qwen_dir(out).transformers_class()
    qwen = model_class.from_pretrained(str(out), dtype=TORCH_DTYPES[profile.compute_dtype], local_files_only=True)
    model = JanusVLNModel(qwen, vggt_feature_dim(profile.vggt), config).to(device)
    missing, unexpected = model.load_state_dict(load_file(str(out / HEADS_FILE)), strict=False)
    unexpected_heads = [k for k in unexpected]
    missing_heads = [k for k in missing if not k.startswith(QWEN_PREFIX)]
    if unexpected_heads or missing_heads:
        raise ValueError(f"{out / HEADS_FILE}: missing {missing_heads}, unexpected {unexpected_heads}")
    return model.eval()
