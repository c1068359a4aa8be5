"""Checkpoint directories of the reference JanusVLN trainer: read one into janus, write one back.

The layout (docs/train.md "Reference JanusVLN checkpoints, both ways") is what the reference trainer saves with transformers 4.50
and what its evaluation loads: a flat Qwen2.5-VL ``config.json`` (text settings at the top level,
no ``text_config``) with the JanusVLN fields, one state dict (``model.safetensors`` or shards with
an index) holding ``model.*``, ``lm_head.*``, ``visual.*``, ``merger.*``, ``action_head.{0,1,3}.*``
and the frozen encoder as ``vggt.aggregator.*``, plus the tokenizer and preprocessor files.

Keys map one to one onto :class:`~janus_train.model.janus_model.JanusVLNModel`'s (:func:`reference_key`).
Reading is strict: a missing or unexpected key, or a shape mismatch, is a one-line
:class:`ReferenceCheckpointError` naming it; only the VGGT depth and point heads the reference
keeps unused (:data:`UNUSED_VGGT_HEADS`) are ignored (:func:`unused_heads_note`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import nn
from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration
from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionTransformerPretrainedModel

from janus_core.bases import QWEN2_5_VL
from janus_core.dtypes import TORCH_DTYPES
from janus_core.profile import CacheSettings, Profile
from janus_core.vggt import REFERENCE_FRAMES, AggregatorConfig, VGGTAggregator
from janus_core.vggt.checkpoint import (
    SAFETENSORS_INDEX_SUFFIX,
    CheckpointError,
    check_state_dict,
    read_safetensors,
    resolve_weights_file,
    safetensors_shapes,
    safetensors_shards,
)
from janus_core.vggt.encoder import WindowEncoder
from janus_train.checkpoint.reference_tokenizer import write_reference_tokenizer
from janus_train.config import TrainSettings
from janus_train.model.janus_model import (
    JanusModelConfig,
    JanusVLNModel,
    VGGTMerger,
    aggregator_config,
    attention_implementation,
    fuse_image_embeddings,
    vggt_feature_dim,
)
from janus_train.model.loss import LossConfig

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
ARCHITECTURE = "Qwen2_5_VLForConditionalGenerationForJanusVLN"
# The reference layout is Qwen2.5-VL's (JanusVLN's released checkpoints).
MODEL_TYPE = QWEN2_5_VL.model_type
# The transformers release the reference code targets; written into the config it reads.
REFERENCE_TRANSFORMERS_VERSION = "4.50.0"
ENCODER_PREFIX = "vggt.aggregator."
# The reference model deletes only VGGT's camera and track heads: its depth and point heads stay in
# every checkpoint it saves (62 tensors each at VGGT-1B), unused by its forward. A reader ignores
# exactly these; any other unexpected key is still an error.
UNUSED_VGGT_HEADS: tuple[str, ...] = ("vggt.depth_head.", "vggt.point_head.")
JANUSVLN_FIELDS: tuple[str, ...] = (
    "lam", "reference_frame", "vggt_merger_hidden_dim",
    "distill_loss_weight", "distill_loss_weight_end", "distill_loss_weight_warmup_steps",
)
# Text settings a 4.50 config keeps at its top level (§2), then the other text settings it reads.
TEXT_FIELDS: tuple[str, ...] = (
    "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "intermediate_size",
    "vocab_size", "max_position_embeddings", "rms_norm_eps", "tie_word_embeddings", "bos_token_id",
    "eos_token_id", "hidden_act", "attention_dropout", "initializer_range", "use_sliding_window",
    "sliding_window", "max_window_layers", "use_cache",
)
TOKEN_ID_FIELDS: tuple[str, ...] = ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")
# JanusVLNModel parameter-name prefix -> reference key prefix (the reference's VGGT merger names its
# RMSNorm ``ln_q`` as Qwen's patch merger does; its action head is a bare Sequential).
_RENAMES: tuple[tuple[str, str], ...] = (
    ("qwen.model.language_model.", "model."),
    ("qwen.model.visual.", "visual."),
    ("qwen.lm_head.", "lm_head."),
    ("vggt_merger.norm.", "merger.ln_q."),
    ("vggt_merger.mlp.", "merger.mlp."),
    ("action_head.net.", "action_head."),
)
_TIED_KEY = "lm_head.weight"


class ReferenceCheckpointError(ValueError):
    """A reference checkpoint directory that cannot be read or does not match; one line, naming it."""


@dataclass(frozen=True)
class ReferenceConfig:
    """A reference ``config.json``: the Qwen2.5-VL config (as transformers 5 holds it) plus the
    JanusVLN fields."""

    qwen: Qwen2_5_VLConfig
    lam: float
    reference_frame: str
    merger_hidden: int
    distill: LossConfig
    """The action-loss weight schedule (the reference's distill_loss_weight* fields)."""


def reference_key(name: str) -> str:
    """The reference state-dict key of a :class:`JanusVLNModel` parameter name."""
    for ours, theirs in _RENAMES:
        if name.startswith(ours):
            return theirs + name[len(ours):]
    raise ValueError(f"parameter {name} has no place in a reference checkpoint")


def janus_key(key: str) -> str | None:
    """The :class:`JanusVLNModel` parameter name of a reference key (None for keys of no parameter)."""
    for ours, theirs in _RENAMES:
        if key.startswith(theirs):
            return ours + key[len(theirs):]
    return None


# ------------------------------------------------------------------------------------- config


def read_reference_config(directory: Path) -> ReferenceConfig:
    """The config of a reference checkpoint directory; a wrong or missing field is named."""
    path = Path(directory) / CONFIG_FILE
    if not path.is_file():
        raise ReferenceCheckpointError(f"{directory}: not a JanusVLN checkpoint directory (no {CONFIG_FILE})")
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ReferenceCheckpointError(f"{path}: cannot read: {exc}") from exc
    if not isinstance(data, dict) or data.get("model_type") != MODEL_TYPE:
        raise ReferenceCheckpointError(f"{path}: model_type must be '{MODEL_TYPE}'")
    if "text_config" in data:
        raise ReferenceCheckpointError(
            f"{path}: has a 'text_config' section (a transformers-5 export, not a reference JanusVLN checkpoint)"
        )
    for name in ("lam", "reference_frame", "vggt_merger_hidden_dim", "hidden_size", "vision_config"):
        if name not in data:
            raise ReferenceCheckpointError(f"{path}: missing field '{name}'")
    if data["reference_frame"] not in REFERENCE_FRAMES:
        raise ReferenceCheckpointError(
            f"{path}: reference_frame {data['reference_frame']!r} is not one of {', '.join(REFERENCE_FRAMES)}"
        )
    qwen_fields = {k: v for k, v in data.items()
                   if k not in JANUSVLN_FIELDS and k not in ("architectures", "transformers_version", "torch_dtype")}
    try:
        # transformers 5 reads the flat 4.50 layout itself (text settings -> text_config, rope_scaling
        # -> rope_parameters).
        qwen = Qwen2_5_VLConfig(**qwen_fields)
        distill = LossConfig(
            float(data.get("distill_loss_weight", LossConfig.distill_loss_weight)),
            None if data.get("distill_loss_weight_end") is None else float(data["distill_loss_weight_end"]),
            int(data.get("distill_loss_weight_warmup_steps") or 0),
        )
        return ReferenceConfig(qwen, float(data["lam"]), data["reference_frame"], int(data["vggt_merger_hidden_dim"]),
                               distill)
    except (TypeError, ValueError) as exc:
        raise ReferenceCheckpointError(f"{path}: invalid config: {exc}") from exc


def reference_config_dict(qwen: Qwen2_5_VLConfig, model: JanusModelConfig, reference_frame: str,
                          distill: LossConfig, dtype: str) -> dict[str, Any]:
    """The flat transformers-4.50 ``config.json`` of a reference checkpoint (no ``text_config``)."""
    text = qwen.text_config.to_dict()
    rope = dict(text.get("rope_parameters") or {})
    vision = {k: v for k, v in qwen.vision_config.to_dict().items()
              if k not in ("model_type", "dtype", "transformers_version")}
    config: dict[str, Any] = {
        "architectures": [ARCHITECTURE],
        "model_type": MODEL_TYPE,
        **{name: text[name] for name in TEXT_FIELDS if name in text},
        "rope_theta": rope["rope_theta"],
        # 4.50 keeps M-RoPE in rope_scaling ("default" rope with the section sizes).
        "rope_scaling": {"type": "default", "rope_type": "default", "mrope_section": list(rope["mrope_section"])},
        "tie_word_embeddings": bool(qwen.tie_word_embeddings),
        **{name: getattr(qwen, name) for name in TOKEN_ID_FIELDS},
        "vision_config": vision,
        "lam": model.lam,
        "reference_frame": reference_frame,
        "vggt_merger_hidden_dim": model.merger_hidden,
        "distill_loss_weight": distill.distill_loss_weight,
        "distill_loss_weight_end": distill.distill_loss_weight_end,
        # The reference writes null for "no ramp".
        "distill_loss_weight_warmup_steps": distill.distill_loss_weight_warmup_steps or None,
        "torch_dtype": dtype,
        "transformers_version": REFERENCE_TRANSFORMERS_VERSION,
    }
    return config


def imported_model_config(config: JanusModelConfig, reference: ReferenceConfig) -> JanusModelConfig:
    """``config`` with the checkpoint's ``lam`` and merger width (they come from the checkpoint)."""
    return replace(config, lam=reference.lam, merger_hidden=reference.merger_hidden)


# ------------------------------------------------------------------------------------ weights


def _weights(directory: Path) -> tuple[Path, dict[str, Path]]:
    try:
        weights_file = resolve_weights_file(directory)
        if not weights_file.name.endswith((".safetensors", SAFETENSORS_INDEX_SUFFIX)):
            raise ReferenceCheckpointError(f"{weights_file}: a reference checkpoint keeps its weights as safetensors")
        return weights_file, safetensors_shards(weights_file)
    except CheckpointError as exc:
        raise ReferenceCheckpointError(str(exc)) from exc


def _used(keys: Mapping[str, Any]) -> dict[str, Any]:
    """``keys`` without the reference's unused VGGT heads."""
    return {key: value for key, value in keys.items() if not key.startswith(UNUSED_VGGT_HEADS)}


def unused_heads(directory: Path) -> list[str]:
    """The keys of the reference's unused VGGT depth/point heads a checkpoint directory holds."""
    _, shards = _weights(Path(directory))
    return [key for key in shards if key.startswith(UNUSED_VGGT_HEADS)]


def unused_heads_note(directory: Path) -> str | None:
    """The one note line for a directory that holds the reference's unused VGGT depth/point heads
    (None when it holds none); they are ignored on reading."""
    ignored = unused_heads(directory)
    if not ignored:
        return None
    return (f"note: {directory} holds VGGT's depth and point heads ({len(ignored)} tensors "
            f"{', '.join(p + '*' for p in UNUSED_VGGT_HEADS)}), which the reference model keeps but never uses; "
            f"ignored")


def _expected_keys(model: nn.Module, tied: bool) -> dict[str, torch.Tensor]:
    """Reference key -> the model's tensor; a tied lm_head is stored once, as the embedding."""
    expected = {reference_key(name): tensor for name, tensor in model.state_dict().items()}
    if tied:
        expected.pop(_TIED_KEY, None)
    return expected


def _check(expected: Mapping[str, torch.Tensor], found: Mapping[str, torch.Tensor], source: Path, what: str) -> None:
    try:
        check_state_dict(expected, found, source, what)
    except CheckpointError as exc:
        raise ReferenceCheckpointError(str(exc)) from exc


def _meta_tensors(shapes: Mapping[str, tuple[int, ...]]) -> dict[str, torch.Tensor]:
    return {key: torch.empty(shape, device="meta") for key, shape in shapes.items()}


def _build(reference: ReferenceConfig, profile: Profile, config: JanusModelConfig, encoder: WindowEncoder | None,
           device: torch.device) -> JanusVLNModel:
    qwen = Qwen2_5_VLForConditionalGeneration._from_config(
        reference.qwen, dtype=TORCH_DTYPES[profile.compute_dtype], attn_implementation=attention_implementation(device)
    )
    return JanusVLNModel(qwen, vggt_feature_dim(profile.vggt), imported_model_config(config, reference), encoder)


def check_reference_checkpoint(directory: Path, profile: Profile) -> ReferenceConfig:
    """Check that a reference checkpoint directory fits a profile without reading any weight: its
    config, its ``reference_frame`` (the profile's ``cache.reference_frame``, the features it was
    trained on), and every key and shape of its state dict (the model's, and the encoder's
    ``vggt.aggregator.*``; the unused ``vggt.depth_head.*`` / ``vggt.point_head.*`` are ignored).
    Raises a one-line :class:`ReferenceCheckpointError` naming the problem."""
    directory = Path(directory)
    reference = read_reference_config(directory)
    if reference.reference_frame != profile.cache.reference_frame:
        raise ReferenceCheckpointError(
            f"{directory}: trained with reference_frame '{reference.reference_frame}', but the profile's "
            f"cache.reference_frame is '{profile.cache.reference_frame}'; set cache.reference_frame to match"
        )
    weights_file, shards = _weights(directory)
    try:
        stored = _meta_tensors(safetensors_shapes(_used(shards)))
    except CheckpointError as exc:
        raise ReferenceCheckpointError(str(exc)) from exc
    with torch.device("meta"):
        model = _build(reference, profile, JanusModelConfig(), None, torch.device("meta"))
        aggregator = VGGTAggregator.from_config(aggregator_config(profile.vggt))
    expected = _expected_keys(model, bool(reference.qwen.tie_word_embeddings))
    expected.update({ENCODER_PREFIX + key: value for key, value in aggregator.state_dict().items()})
    _check(expected, stored, weights_file, "the JanusVLN model")
    return reference


def load_reference_model(directory: Path, profile: Profile, config: JanusModelConfig, live: bool = False,
                         device: torch.device | str = "cpu") -> JanusVLNModel:
    """A :class:`JanusVLNModel` whose Qwen weights, VGGT merger and action head are those of a
    reference checkpoint directory, with its ``lam`` and merger width, in the profile's compute dtype.

    The profile still names the tokenizer and the encoder (``live``). Strict, see
    :func:`check_reference_checkpoint`; the ``vggt.aggregator.*`` weights are checked, not loaded
    (the encoder is the profile's ``vggt``, which may name the same directory).
    """
    directory = Path(directory)
    reference = check_reference_checkpoint(directory, profile)
    _, shards = _weights(directory)
    device = torch.device(device)
    encoder = WindowEncoder.from_settings(profile.vggt, profile.cache, device) if live else None
    model = _build(reference, profile, config, encoder, device)
    dtype = TORCH_DTYPES[profile.compute_dtype]
    found = read_safetensors(shards, [key for key in _used(shards) if not key.startswith(ENCODER_PREFIX)])
    missing, unexpected = model.load_state_dict({str(janus_key(k)): t.to(dtype) for k, t in found.items()}, strict=False)
    # Only a tied lm_head may be absent: it is the embedding matrix itself (checked above).
    assert not unexpected and all(reference_key(name) == _TIED_KEY for name in missing), (missing, unexpected)
    return model.to(device)


def run_model_config(settings: TrainSettings) -> JanusModelConfig:
    """The model config a run trains: the profile's, with ``init_from``'s lam and merger width."""
    config = settings.model_config()
    if settings.init_from is None:
        return config
    return imported_model_config(config, read_reference_config(settings.init_from))


def start_model(profile: Profile, settings: TrainSettings, live: bool = False,
                device: torch.device | str = "cpu") -> JanusVLNModel:
    """The model a run starts from: the reference checkpoint ``init_from`` when set, else the profile's."""
    if settings.init_from is not None:
        return load_reference_model(settings.init_from, profile, settings.model_config(), live, device)
    return JanusVLNModel.from_profile(profile, settings.model_config(), live=live, device=device)


def write_reference_checkpoint(out: Path, state: Mapping[str, torch.Tensor], encoder_state: Mapping[str, torch.Tensor],
                               config: dict[str, Any], tokenizer_dir: Path, dtype: torch.dtype) -> Path:
    """Write a reference checkpoint directory: ``config`` (see :func:`reference_config_dict`), the
    :class:`JanusVLNModel` state dict ``state`` and the bare aggregator state ``encoder_state`` as
    one ``model.safetensors`` in ``dtype``, and the tokenizer and preprocessor files of ``tokenizer_dir``
    in the form transformers 4.50 reads (:mod:`janus_train.checkpoint.reference_tokenizer`)."""
    tensors = {reference_key(name): tensor.detach().to("cpu", dtype).contiguous() for name, tensor in state.items()}
    if config["tie_word_embeddings"]:
        tensors.pop(_TIED_KEY, None)
    tensors.update({ENCODER_PREFIX + key: t.detach().to("cpu", dtype).contiguous() for key, t in encoder_state.items()})
    out.mkdir(parents=True, exist_ok=True)
    # "format": "pt" is the metadata transformers' loader expects of a safetensors checkpoint.
    save_file(tensors, str(out / WEIGHTS_FILE), metadata={"format": "pt"})
    (out / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
    write_reference_tokenizer(tokenizer_dir, out)
    return out


# ----------------------------------------------------------------------- checking a cache against it


@dataclass
class ReferenceImageFusion:
    """The fused image embeddings of a reference checkpoint: its Qwen vision tower plus ``lam``
    times its VGGT merger. ``image_embeddings`` has the signature of
    :meth:`JanusVLNModel.image_embeddings`, so verify's live check takes it in the model's place."""

    visual: nn.Module
    merger: VGGTMerger
    lam: float

    @torch.no_grad()
    def image_embeddings(self, frames: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        """uint8 frames [B, S, H, W, 3] and VGGT features [B, N, 2C] -> [B, S, T, hidden]."""
        device = self.merger.norm.weight.device
        return fuse_image_embeddings(self.visual, self.merger, self.lam, frames.to(device), features)


def reference_live_check(directory: Path, cache: CacheSettings, aggregator: AggregatorConfig | None = None,
                         device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
                         ) -> tuple[WindowEncoder, ReferenceImageFusion]:
    """The frozen encoder (``vggt.aggregator.*``) and the fused-embedding function of a reference
    checkpoint directory, for checking a cache made with ``cache`` settings against it.

    ``aggregator`` is the encoder's architecture (default: VGGT-1B, as the reference always uses).
    The vision tower and merger compute in ``dtype`` (the profile's compute dtype, for verify's
    tolerances). Only the encoder, the vision tower and the merger are read (the language model is
    not built).
    """
    directory = Path(directory)
    reference = read_reference_config(directory)
    if reference.reference_frame != cache.reference_frame:
        raise ReferenceCheckpointError(
            f"{directory}: trained with reference_frame '{reference.reference_frame}', but the cache's is "
            f"'{cache.reference_frame}'"
        )
    weights_file, shards = _weights(directory)
    device = torch.device(device)
    architecture = replace(aggregator if aggregator is not None else AggregatorConfig(), attention=cache.attention)
    try:
        model = VGGTAggregator.from_pretrained(weights_file, config=architecture)
    except CheckpointError as exc:
        raise ReferenceCheckpointError(str(exc)) from exc
    window_encoder = WindowEncoder(model.to(device), cache.reference_frame, cache.layer,
                                   TORCH_DTYPES[cache.feature_dtype])

    visual = Qwen2_5_VisionTransformerPretrainedModel._from_config(reference.qwen.vision_config, dtype=torch.float32)
    merger = VGGTMerger(2 * architecture.embed_dim, reference.qwen.text_config.hidden_size, reference.merger_hidden)
    # Per module: its stored prefix, the reference keys of its tensors, and a key's name inside it.
    parts = (
        (visual, "visual.", {"visual." + key: value for key, value in visual.state_dict().items()},
         lambda key: key[len("visual."):]),
        (merger, "merger.", {reference_key("vggt_merger." + key): value for key, value in merger.state_dict().items()},
         lambda key: str(janus_key(key)).removeprefix("vggt_merger.")),
    )
    for module, prefix, expected, local_name in parts:
        found = read_safetensors(shards, [key for key in shards if key.startswith(prefix)])
        _check(expected, found, weights_file, f"the {prefix.rstrip('.')} of a JanusVLN model")
        module.load_state_dict({local_name(key): tensor.float() for key, tensor in found.items()})
    return window_encoder, ReferenceImageFusion(visual.to(device, dtype).eval(), merger.to(device, dtype).eval(),
                                                reference.lam)
