"""The frozen Qwen ViT, run once per frame: the input of its trainable patch merger(s).

Qwen2.5-VL's vision tower is ``patch_embed -> 32 frozen blocks -> merger``; only the merger (the
projector) trains in JanusVLN. The blocks' output for a frame depends on nothing but the frame and
the frozen weights, and a frame is shared by ~9 windows, so the cache can hold it per frame
(``cache.vit_features``) and training runs only the merger on it.

One function runs the frozen blocks for both the live path (the model's forward) and the
precompute: :func:`vit_blocks` (on pixel values built from uint8 frames on their device, all frames
of a call at once, as Qwen's ``get_image_features``). What is cached is its output, the last
block's hidden states, per frame: ``[frames, grid tokens, D]`` (D = the ViT hidden size, 1280 for
the 7B) in the order the blocks compute them, the tower's attention-window order (windows never
cross frames, so a frame's tokens are one contiguous block of it). The merger then runs on the
cached rows in exactly the live order (:func:`merge`, :func:`merge_cached`): its forward and the
order in which its weight gradients sum over tokens are those of the live step, bit for bit.

Qwen3-VL (a DeepStack base, :mod:`janus_core.bases`) has no attention windows (rows stay in patch
order) and its ViT gives more than the last block: the outputs of blocks
``deepstack_visual_indexes`` each pass their own trainable DeepStack merger. Its cached output per
frame is therefore ``[levels, grid tokens, D]``: level 0 the last block's hidden states (the patch
merger's input), level ``1 + i`` DeepStack merger ``i``'s input (:func:`deepstack_blocks`,
:func:`merge_cached_deepstack`). A Qwen2.5-VL frame keeps its ``[grid tokens, D]``.

The tower's weights come from the profile's Qwen directory (:func:`load_vision_tower`): the
``visual.*`` tensors of its checkpoint, or, with ``qwen.random_init``, the whole model drawn from
the seed exactly as the trainer draws it (the vision tower's weights depend on every module drawn
before them). :func:`vit_fingerprint` hashes the weights of the blocks the cache stands for.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from janus_core.bases import DEFAULT_BASE, QwenBase, base_of_config, base_of_qwen_dir
from janus_core.dtypes import TORCH_DTYPES
from janus_core.imaging import qwen_pixel_values
from janus_core.profile import LanguageModelSettings, Profile
from janus_core.vggt import weights_fingerprint

MERGER_PREFIX = "merger."
"""Parameter-name prefix of the trainable patch merger inside the vision tower (not fingerprinted:
the cache holds its input)."""
DEEPSTACK_MERGER_PREFIX = "deepstack_merger_list."
"""Parameter-name prefix of Qwen3-VL's trainable DeepStack mergers (not fingerprinted either)."""
TRAINABLE_PREFIXES = (MERGER_PREFIX, DEEPSTACK_MERGER_PREFIX)
"""The vision tower's parameters that train on top of cached ViT features (the projector)."""
CHECKPOINT_PREFIXES = ("model.visual.", "visual.")
"""Where a Qwen2.5-VL checkpoint keeps the vision tower's tensors (transformers 5, older)."""


class ViTLoadError(ValueError):
    """The profile's Qwen directory does not hold a loadable vision tower; the message names it."""


def vit_stored_dtype(compute_dtype: str) -> str:
    """The dtype ViT features are cached in for a profile computing in ``compute_dtype``: bf16 where
    the model computes in bf16 (what the live ViT gives the merger), else the compute dtype itself
    (float32 on the tiny CPU profile, so a cached step equals the live one bit for bit)."""
    return compute_dtype


def base_model_name(settings: LanguageModelSettings) -> str:
    """The Qwen directory's name (what the manifest records as the base model: e.g. Qwen2.5-VL-7B-Instruct)."""
    return Path(settings.path).name


def load_vision_tower(settings: LanguageModelSettings, dtype: torch.dtype = torch.float32,
                      device: str | torch.device = "cpu", attn_implementation: str = "sdpa") -> nn.Module:
    """The base's vision tower (Qwen2.5-VL's or Qwen3-VL's, by the directory's config ``model_type``;
    frozen, eval mode) as the trainer's model holds it.

    ``random_init``: the whole model is drawn on the CPU from the seed, as
    ``janus_train.model.janus_model.load_qwen`` draws it, and its tower kept. Otherwise only the checkpoint's
    vision tensors are read (never the 7B language model)."""
    from transformers import AutoConfig

    path = Path(settings.path)
    config = AutoConfig.from_pretrained(path, local_files_only=True)
    base = base_of_config(config)
    if settings.random_init:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(settings.seed)
            model = base.transformers_class("model")._from_config(
                config, dtype=dtype, attn_implementation=attn_implementation)
        visual = model.model.visual
        del model
    else:
        visual = base.transformers_class("vision")._from_config(
            config.vision_config, dtype=dtype, attn_implementation=attn_implementation)
        state = _checkpoint_vision_state(path)
        missing, unexpected = visual.load_state_dict(state, strict=False)
        if missing or unexpected:
            raise ViTLoadError(f"{path}: the checkpoint's vision tower does not fit its config "
                               f"(missing {sorted(missing)[:3]}, unexpected {sorted(unexpected)[:3]})")
        visual.to(dtype)
    visual.requires_grad_(False)
    return visual.eval().to(device)


def _checkpoint_vision_state(path: Path) -> dict[str, torch.Tensor]:
    """The vision tower's tensors of the safetensors checkpoint in ``path``, keys relative to the tower."""
    from safetensors import safe_open

    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ViTLoadError(f"{path} has no *.safetensors weights; set 'qwen.random_init: true' for a config-only "
                           "directory")
    state: dict[str, torch.Tensor] = {}
    for file in files:
        with safe_open(str(file), framework="pt") as handle:
            for key in handle.keys():
                prefix = next((p for p in CHECKPOINT_PREFIXES if key.startswith(p)), None)
                if prefix is not None:
                    state[key[len(prefix):]] = handle.get_tensor(key)
    if not state:
        raise ViTLoadError(f"{path}: no vision tower tensors ({' or '.join(CHECKPOINT_PREFIXES)}*) in its checkpoint")
    return state


def vit_fingerprint(visual: nn.Module) -> str:
    """sha256 over the frozen tower's weights (everything but the mergers) and its architecture."""
    state = {k: v for k, v in visual.state_dict().items() if not k.startswith(TRAINABLE_PREFIXES)}
    digest = hashlib.sha256(weights_fingerprint(state).encode())
    config = visual.config.to_dict()
    architecture = {k: config[k] for k in sorted(config) if k in _ARCHITECTURE_KEYS}
    digest.update(json.dumps(architecture, sort_keys=True).encode())
    return digest.hexdigest()


_ARCHITECTURE_KEYS = frozenset({"depth", "hidden_size", "hidden_act", "intermediate_size", "num_heads", "in_channels",
                                "patch_size", "spatial_merge_size", "temporal_patch_size", "window_size",
                                "fullatt_block_indexes", "deepstack_visual_indexes", "num_position_embeddings"})
"""Vision config entries that change the blocks' numbers without changing a weight's shape (a
Qwen2.5-VL config has none of the last two: its fingerprint is unchanged by them)."""


def vit_blocks(visual: nn.Module, pixel_values: torch.Tensor, grid_thw: torch.Tensor,
               **layout: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Qwen2.5-VL's ViT up to its patch merger, exactly as its own forward runs it: the hidden
    states [patches, vision hidden] in the ViT's window order, and that order (``window_index``,
    per 2x2 merge group). ``layout`` takes precomputed ``position_ids``, ``cu_seqlens``,
    ``window_index``, ``cu_window_seqlens`` (e.g. on the meta device, whose grids have no values).

    The one function that runs the frozen blocks: the model's live path
    (``janus_train.model.janus_model.vit_embeddings``) and the precompute (:class:`ViTEncoder`) both call it."""
    from transformers.vision_utils import (
        get_max_seqlen,
        get_vision_attention_seqlens,
        get_vision_position_ids,
        get_vision_window_index,
    )

    kwargs = dict(layout)
    position_ids = get_vision_position_ids(grid_thw, visual.spatial_merge_size, kwargs=kwargs)
    cu_seqlens, max_seqlen = get_vision_attention_seqlens(grid_thw, visual.config, kwargs=kwargs)
    window_index, cu_window_seqlens = get_vision_window_index(
        grid_thw, spatial_merge_size=visual.spatial_merge_size, window_size=visual.window_size,
        patch_size=visual.patch_size, kwargs=kwargs,
    )
    max_window_seqlen = get_max_seqlen(cu_window_seqlens, visual.config, kwargs=kwargs, kwarg_name="max_window_seqlen")
    hidden = visual.patch_embed(pixel_values)
    rows = hidden.shape[0]
    hidden = visual.permute_input_for_window_attn(hidden, window_index, seq_len=rows)
    position_embeddings = tuple(
        visual.permute_input_for_window_attn(freq, window_index, seq_len=rows)
        for freq in visual.rotary_pos_emb(hidden, position_ids)
    )
    for index, block in enumerate(visual.blocks):
        full = index in visual.fullatt_block_indexes
        hidden = block(hidden, cu_seqlens=cu_seqlens if full else cu_window_seqlens,
                       max_seqlen=max_seqlen if full else max_window_seqlen,
                       position_embeddings=position_embeddings, **kwargs)
    return hidden, window_index


def merge(visual: nn.Module, hidden: torch.Tensor, window_index: torch.Tensor) -> torch.Tensor:
    """Qwen's trainable patch merger on :func:`vit_blocks`' hidden states (window order): the
    image embeddings [patches / 4, hidden] in image order, as the tower's own forward gives them."""
    return visual.merger(hidden)[torch.argsort(window_index)]


def merge_cached(visual: nn.Module, vit_features: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
    """The merged image embeddings ``[n * T, out]`` (image order) of cached ViT features
    ``[n, grid tokens, D]`` of frames with a ``grid`` (h, w) of patches: only the trainable merger
    runs (in its dtype), on the rows in the live path's order (:func:`merge`)."""
    from transformers.vision_utils import get_vision_window_index

    n = vit_features.shape[0]
    grid_thw = torch.tensor([[1, *grid]], dtype=torch.int64).expand(n, 3)
    window_index, _ = get_vision_window_index(grid_thw, spatial_merge_size=visual.spatial_merge_size,
                                              window_size=visual.window_size, patch_size=visual.patch_size)
    dtype = next(visual.merger.parameters()).dtype
    hidden = vit_features.reshape(-1, vit_features.shape[-1]).to(dtype)
    return merge(visual, hidden, window_index.to(hidden.device))


def deepstack_blocks(visual: nn.Module, pixel_values: torch.Tensor, grid_thw: torch.Tensor) -> torch.Tensor:
    """A DeepStack tower's (Qwen3-VL's) frozen blocks' output, ``[levels, patches, D]`` in patch
    order: the last block's hidden states, then each DeepStack merger's input. The tower's own
    forward runs (so every block, position embedding and rotary table is exactly the live one);
    the mergers' inputs are read by hooks, their outputs dropped."""
    inputs: list[torch.Tensor] = []
    hooks = [merger.register_forward_pre_hook(lambda _module, args: inputs.append(args[0]))
             for merger in visual.deepstack_merger_list]
    try:
        out = visual(pixel_values, grid_thw=grid_thw, return_dict=True)
    finally:
        for hook in hooks:
            hook.remove()
    return torch.stack([out.last_hidden_state, *inputs])


def merge_cached_deepstack(visual: nn.Module, vit_features: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """A DeepStack tower's embeddings of cached features ``[n, levels, grid tokens, D]``
    (:func:`deepstack_blocks` per frame): the patch merger's image embeddings ``[n * T, out]`` and
    each DeepStack merger's ``[n * T, out]``, image order, as the tower's forward gives them. Only
    the trainable mergers run (in their dtype), each on all ``n`` frames' rows at once, as live."""
    n, levels, _, width = vit_features.shape
    if levels != 1 + len(visual.deepstack_merger_list):
        raise ValueError(f"cached ViT features have {levels} levels, the tower {1 + len(visual.deepstack_merger_list)}")
    dtype = next(visual.merger.parameters()).dtype
    rows = vit_features.to(dtype).transpose(0, 1).reshape(levels, -1, width)
    return visual.merger(rows[0]), [merger(rows[1 + i]) for i, merger in enumerate(visual.deepstack_merger_list)]


def merge_cached_output(visual: nn.Module, base: QwenBase, vit_features: torch.Tensor, grid: tuple[int, int]
                        ) -> tuple[torch.Tensor, list[torch.Tensor] | None]:
    """The embeddings of cached ViT features of ``n`` frames (``[n, *feature shape]``,
    :meth:`QwenBase.vit_feature_shape`) of a ``grid`` of patches: the patch merger's ``[n * T, out]``
    and, for a DeepStack base, each DeepStack merger's (else None): :func:`merge_cached` or
    :func:`merge_cached_deepstack`."""
    if base.deepstack:
        return merge_cached_deepstack(visual, vit_features)
    return merge_cached(visual, vit_features, grid), None


@dataclass
class ViTEncoder:
    """The frozen tower of a profile, turning uint8 frames ``[n, H, W, 3]`` into cached ViT features
    ``[n, grid tokens, D]`` (each frame's tokens in the blocks' window order; a DeepStack ``base``:
    ``[n, levels, grid tokens, D]``, see the module doc) in ``stored_dtype``, ``frames_per_call``
    frames per tower call.

    ``frames_per_call`` is the frames of one sample's window (``history + 1``): the batch shape the
    live path runs at micro batch 1, so precompute and training run the same kernels."""

    visual: nn.Module
    stored_dtype: str
    frames_per_call: int
    fingerprint: str
    base_model: str
    base: QwenBase = DEFAULT_BASE

    @classmethod
    def from_profile(cls, profile: Profile, device: str | torch.device = "cpu",
                     attn_implementation: str = "sdpa") -> ViTEncoder:
        visual = load_vision_tower(profile.qwen, TORCH_DTYPES[profile.compute_dtype], device, attn_implementation)
        return cls(visual, vit_stored_dtype(profile.compute_dtype), profile.cache.history + 1,
                   vit_fingerprint(visual), base_model_name(profile.qwen), base_of_qwen_dir(profile.qwen.path))

    @property
    def hidden_size(self) -> int:
        return int(self.visual.config.hidden_size)

    @property
    def device(self) -> torch.device:
        return next(self.visual.parameters()).device

    def feature_shape(self, height: int, width: int) -> tuple[int, ...]:
        """``(grid tokens, D)`` of one ``height`` x ``width`` frame (a DeepStack base: ``(levels, grid tokens, D)``)."""
        gh, gw = self.base.patch_grid(height, width)
        return self.base.vit_feature_shape(self.visual.config, gh * gw)

    @torch.no_grad()
    def encode(self, frames: torch.Tensor) -> torch.Tensor:
        """ViT features of uint8 frames ``[n, H, W, 3]`` in the stored dtype, on the tower's device."""
        if frames.dim() != 4 or frames.dtype != torch.uint8:
            raise ValueError(f"expected uint8 frames [n, H, W, 3], got {frames.dtype} {tuple(frames.shape)}")
        frames = frames.to(self.device, non_blocking=True)
        parts = []
        for start in range(0, frames.shape[0], self.frames_per_call):
            # As the model's live path: pixel values in the tower's dtype, the frames in one call.
            pixel_values, grid_thw = qwen_pixel_values(frames[start:start + self.frames_per_call], base=self.base)
            if self.base.deepstack:
                levels = deepstack_blocks(self.visual, pixel_values.type(self.visual.dtype), grid_thw)
                n = int(grid_thw.shape[0])
                parts.append(levels.reshape(levels.shape[0], n, -1, levels.shape[-1]).transpose(0, 1))
                continue
            hidden, window_index = vit_blocks(self.visual, pixel_values.type(self.visual.dtype), grid_thw)
            # Window order, frame by frame (a frame's tokens are contiguous in it): see the module doc.
            parts.append(hidden.reshape(int(grid_thw.shape[0]), -1, hidden.shape[-1]))
        return torch.cat(parts).to(TORCH_DTYPES[self.stored_dtype])
