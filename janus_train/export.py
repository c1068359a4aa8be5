"""Export a ZeRO-3 checkpoint as consolidated weights that transformers loads.

``<out>/`` becomes a Qwen2.5-VL directory (config, tokenizer, safetensors) that
``Qwen2_5_VLForConditionalGeneration.from_pretrained`` loads, plus ``janus_heads.safetensors``
with the VGGT merger and the action head, which ``load_exported`` puts back on a JanusVLNModel.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from janus_cache.dtypes import TORCH_DTYPES
from janus_cache.profile import Profile
from janus_train.model import JanusModelConfig, JanusVLNModel, vggt_feature_dim

HEADS_FILE = "janus_heads.safetensors"
QWEN_PREFIX = "qwen."
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json",
                    "preprocessor_config.json", "vocab.json", "merges.txt", "generation_config.json")


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
    out.mkdir(parents=True, exist_ok=True)
    model.qwen.to(torch_dtype).save_pretrained(str(out), state_dict=qwen_state, safe_serialization=True)
    for name in _TOKENIZER_FILES:
        if (profile.qwen.path / name).is_file():
            shutil.copy2(profile.qwen.path / name, out / name)
    save_file(heads, str(out / HEADS_FILE), metadata={"lam": str(config.lam)})
    return out


def load_exported(out: Path, profile: Profile, config: JanusModelConfig, device: str = "cpu") -> JanusVLNModel:
    """A JanusVLNModel whose Qwen part transformers loaded from ``out`` and whose heads come from it too."""
    from transformers import Qwen2_5_VLForConditionalGeneration

    qwen = Qwen2_5_VLForConditionalGeneration.from_pretrained(str(out), dtype=TORCH_DTYPES[profile.compute_dtype])
    model = JanusVLNModel(qwen, vggt_feature_dim(profile.vggt), config).to(device)
    missing, unexpected = model.load_state_dict(load_file(str(out / HEADS_FILE)), strict=False)
    unexpected_heads = [k for k in unexpected]
    missing_heads = [k for k in missing if not k.startswith(QWEN_PREFIX)]
    if unexpected_heads or missing_heads:
        raise ValueError(f"{out / HEADS_FILE}: missing {missing_heads}, unexpected {unexpected_heads}")
    return model.eval()
