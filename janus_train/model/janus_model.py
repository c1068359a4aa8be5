"""The JanusVLN model: a Qwen base (Qwen2.5-VL or Qwen3-VL, :mod:`janus_core.bases`) + a trainable
VGGT merger that injects 3-D features + an action head.

Per micro-batch (B samples, each with S images of H x W pixels and one VGGT feature [N, 2C]):

1. ``pixel_values`` are built from the uint8 frames on the model's device (lookup-table path,
   :func:`janus_core.imaging.qwen_pixel_values`) and run through Qwen's ViT: ``T = N/4`` image
   embeddings per image. A batch with the frames' cached ViT output (``vit_features``,
   ``cache.vit_features``) skips both: only the ViT's trainable merger(s) run on it.
   A Qwen3-VL ViT also returns its DeepStack features (one per ``deepstack_visual_indexes``
   layer), which the LLM adds to the hidden states of its first layers at the visual positions,
   as the base does; the 3-D term goes to the main image embeddings only.
2. The VGGT feature comes from the batch (cached) or, for a model built with a frozen encoder and a
   batch without features, from the encoder run on the same frames (live; for Qwen3-VL on VGGT's
   own frames of the same sources, the batch's ``vggt_frames``). The merger maps it to
   ``T`` embeddings, which are added, times ``lam``, to the image embeddings of every image of
   *that* sample (JanusVLN adds one 3-D embedding to all images of a sample).
3. Image embeddings replace the ``<|image_pad|>`` token embeddings; M-RoPE positions come with the
   batch (built by the loader workers, :mod:`janus_train.data.rope`) or, for a batch without them, from
   Qwen's own ``get_rope_index`` here; the language model runs on the embeddings.
4. Token logits are computed only for the supervised answer tokens; the action head reads the
   hidden state just before the answer. The forward returns the loss sums
   (:class:`janus_train.model.loss.LossParts`); :func:`janus_train.model.loss.micro_batch_loss` turns them into
   the loss with the accumulated batch's denominators.

A frozen ViT (patch embedding and blocks) runs outside autograd (:func:`vit_embeddings`): no
graph, nothing of it in the backward; only its trainable patch merger and what follows record one.

Where Qwen's ViT would use ``sdpa`` it runs one varlen FlashAttention call per layer on CUDA
(:mod:`janus_train.model.vision_attention`) instead of one SDPA call per attention window.

The frozen VGGT encoder is held outside the module tree: it is not in ``state_dict()``,
``parameters()`` or an optimizer, and an engine that shards the model never sees it.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import nn
from transformers import AutoConfig, PreTrainedModel

# JanusVLN's VGGT merger normalises with this RMSNorm, whatever the base.
from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLRMSNorm

from janus_core.bases import DEFAULT_BASE, VGGT_PATCH_SIZE, QwenBase, base_of_config
from janus_core.dtypes import TORCH_DTYPES
from janus_core.imaging import qwen_pixel_values
from janus_core.index import ACTIONS
from janus_core.profile import EncoderSettings, LanguageModelSettings, Profile
from janus_core.qwen_vit import TRAINABLE_PREFIXES as VIT_TRAINABLE_PREFIXES

# The frozen blocks and the merger's order: one function each for the live and the cached ViT path.
from janus_core.qwen_vit import merge as vit_merge
from janus_core.qwen_vit import merge_cached_output, vit_blocks
from janus_core.resolution import grid_shape
from janus_core.vggt import AggregatorConfig
from janus_core.vggt.checkpoint import resolve_config, resolve_weights_file
from janus_core.vggt.encoder import WindowEncoder
from janus_train.data.rope import RopeIndex
from janus_train.model.activation_checkpointing import ActivationCheckpointing
from janus_train.model.loss import LossParts, action_cross_entropy, token_cross_entropy
from janus_train.model.model_config import JanusModelConfig, TrainableParts
from janus_train.model.vision_attention import use_varlen_vision_attention

PARTS: tuple[str, ...] = ("language_model", "projector", "vision_tower", "vggt_merger", "action_head")
"""Named parameter sets. ``language_model``: Qwen's LLM (embeddings, decoder, final norm) and
lm_head; ``projector``: Qwen's ViT merger; ``vision_tower``: Qwen's ViT patch embedding and blocks;
``vggt_merger`` and ``action_head``: the JanusVLN additions."""

LR_GROUP_OF_PART: Mapping[str, str] = {
    "language_model": "base",
    "action_head": "base",
    # Both mergers project vision features into the LLM's embedding space and share the projector
    # LR, as in the reference trainer, which gives every parameter named "*merger*" that LR.
    "projector": "projector",
    "vggt_merger": "projector",
    "vision_tower": "vision",
}

# Parameter-name prefixes of each part, checked in order (the ViT merger before the rest of the ViT).
_PART_PREFIXES: tuple[tuple[str, str], ...] = (
    ("qwen.model.visual.merger.", "projector"),
    # Qwen3-VL's DeepStack mergers project ViT features into the LLM like the main merger (and the
    # reference gives every "*merger*" parameter the projector LR): they are projector too.
    ("qwen.model.visual.deepstack_merger_list.", "projector"),
    ("qwen.model.visual.", "vision_tower"),
    ("qwen.model.language_model.", "language_model"),
    ("qwen.lm_head.", "language_model"),
    ("vggt_merger.", "vggt_merger"),
    ("action_head.", "action_head"),
)



class ModelInputError(ValueError):
    """A batch does not fit the model; the message says which input and how."""


# ------------------------------------------------------------------------------------ loading


def attention_implementation(device: torch.device | str) -> str:
    """``flash_attention_2`` on CUDA when flash-attn is installed, else PyTorch's ``sdpa``."""
    if torch.device(device).type == "cuda" and importlib.util.find_spec("flash_attn") is not None:
        return "flash_attention_2"
    return "sdpa"


def load_qwen(
    settings: LanguageModelSettings,
    dtype: torch.dtype = torch.float32,
    attn_implementation: str | None = None,
) -> PreTrainedModel:
    """The base's ``...ForConditionalGeneration`` (Qwen2.5-VL or Qwen3-VL, by the directory's
    config ``model_type``) from a local directory: its weights, or (``random_init``) seeded random
    weights from its config.json alone. Never downloads. ``attn_implementation`` defaults to
    :func:`attention_implementation` for CUDA when a GPU is visible, else for the CPU."""
    if attn_implementation is None:
        attn_implementation = attention_implementation("cuda" if torch.cuda.is_available() else "cpu")
    path = Path(settings.path)
    config = AutoConfig.from_pretrained(path, local_files_only=True)
    base = base_of_config(config)
    model_class = base.transformers_class()
    if settings.random_init:
        # Drawn on the CPU from the profile's seed: every process builds the same weights.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(settings.seed)
            model = model_class._from_config(config, dtype=dtype, attn_implementation=attn_implementation)
        return model
    try:
        return model_class.from_pretrained(
            path, dtype=dtype, attn_implementation=attn_implementation, local_files_only=True
        )
    except OSError as exc:
        raise OSError(
            f"cannot load {base.name} weights from {path} (setting 'qwen.path'): {exc}; "
            "for a config-only directory set 'qwen.random_init: true'"
        ) from exc


def aggregator_config(settings: EncoderSettings) -> AggregatorConfig:
    """The architecture of a profile's VGGT encoder, from its config (no weights loaded)."""
    if settings.path is not None:
        return resolve_config(resolve_weights_file(settings.path), None)
    assert settings.config is not None
    return AggregatorConfig.from_dict(json.loads(Path(settings.config).read_text()))


def vggt_feature_dim(settings: EncoderSettings) -> int:
    """Width 2C of the VGGT features of a profile's encoder, from its config (no weights loaded)."""
    return 2 * aggregator_config(settings).embed_dim


# ------------------------------------------------------------------------------------ modules


def group_patches(tokens: torch.Tensor, grid: tuple[int, int], merge: int = DEFAULT_BASE.merge_size) -> torch.Tensor:
    """Concatenate each ``merge x merge`` block of row-major patch tokens, in Qwen's merge order.

    ``tokens`` [B, h*w, D] in row-major patch order -> [B, (h//m)*(w//m), m*m*D]: blocks in
    row-major block order, the m*m patches of a block row-major inside it (Qwen's ViT merger sees
    its patches in exactly this order). An odd last patch row/column is cropped.
    """
    batch, n, dim = tokens.shape
    h, w = grid
    if n != h * w:
        raise ModelInputError(f"{n} patch tokens do not form a {h}x{w} grid")
    he, we = h - h % merge, w - w % merge
    if he == 0 or we == 0:
        raise ModelInputError(f"a {h}x{w} patch grid has no complete {merge}x{merge} block")
    blocks = tokens.view(batch, h, w, dim)[:, :he, :we].reshape(batch, he // merge, merge, we // merge, merge, dim)
    return blocks.permute(0, 1, 3, 2, 4, 5).reshape(batch, (he // merge) * (we // merge), merge * merge * dim)


class VGGTMerger(nn.Module):
    """RMSNorm per token -> 2x2 patch grouping -> Linear -> GELU -> Linear (VGGT feature -> LLM embedding)."""

    def __init__(self, feature_dim: int, out_dim: int, hidden_dim: int = 4096,
                 merge: int = DEFAULT_BASE.merge_size) -> None:
        super().__init__()
        self.merge = merge
        self.norm = Qwen2_5_VLRMSNorm(feature_dim, eps=1e-6)
        self.mlp = nn.Sequential(
            nn.Linear(merge * merge * feature_dim, hidden_dim),
            nn.GELU(),
            nn.Linear(hidden_dim, out_dim),
        )

    def forward(self, features: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
        """[B, h*w, 2C] -> [B, (h//2)*(w//2), out_dim]."""
        return self.mlp(group_patches(self.norm(features), grid, self.merge))


class ActionHead(nn.Module):
    """Linear -> LayerNorm -> GELU -> Linear: one hidden state -> logits over the actions."""

    def __init__(self, hidden_size: int, inner: int = 512, n_actions: int = len(ACTIONS)) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(hidden_size, inner), nn.LayerNorm(inner), nn.GELU(), nn.Linear(inner, n_actions)
        )

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.net(hidden)


# -------------------------------------------------------------------------------------- model


class JanusOutput(NamedTuple):
    """What one forward returns: the loss sums, the action logits [B, n_actions] (float32), the
    VGGT features used [B, N, 2C] (cached or live; for live checks) and, on request, the last
    hidden states [B, L, hidden]. A named tuple: DeepSpeed's ZeRO-3 hooks see its tensors."""

    loss_parts: LossParts
    action_logits: torch.Tensor
    features: torch.Tensor
    hidden_states: torch.Tensor | None = None


def part_of(name: str) -> str:
    """The parameter set (:data:`PARTS`) a parameter name of :class:`JanusVLNModel` belongs to."""
    for prefix, part in _PART_PREFIXES:
        if name.startswith(prefix):
            return part
    raise ValueError(f"parameter {name} belongs to no known part ({', '.join(PARTS)})")


class JanusVLNModel(nn.Module):
    """A Qwen base with VGGT-feature injection and an action head (see the module docstring).

    ``feature_dim`` is the VGGT feature width 2C (2048 for VGGT-1B). ``encoder`` (optional) is the
    frozen VGGT used for batches without cached features.
    """

    def __init__(
        self,
        qwen: PreTrainedModel,
        feature_dim: int,
        config: JanusModelConfig | None = None,
        encoder: WindowEncoder | None = None,
    ) -> None:
        super().__init__()
        self.config = config if config is not None else JanusModelConfig()
        self.qwen = qwen
        self.base: QwenBase = base_of_config(qwen.config)
        use_varlen_vision_attention(qwen)
        hidden = qwen.config.text_config.hidden_size
        if encoder is not None:
            encoder_dim = 2 * encoder.model.config.embed_dim
            if encoder_dim != feature_dim:
                raise ValueError(f"feature_dim {feature_dim} differs from the encoder's feature width {encoder_dim}")
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.config.init_seed)
            self.vggt_merger = VGGTMerger(feature_dim, hidden, self.config.merger_hidden, self.base.merge_size)
            self.action_head = ActionHead(hidden, self.config.action_hidden)
        self.vggt_merger.to(qwen.dtype)
        self.action_head.to(qwen.dtype)
        # A plain attribute, not a submodule: see the module docstring.
        self.encoder = encoder
        self.feature_dim = feature_dim
        self.image_token_id = int(qwen.config.image_token_id)
        self.set_trainable(self.config.trainable)

    @classmethod
    def from_profile(
        cls,
        profile: Profile,
        config: JanusModelConfig | None = None,
        live: bool = False,
        device: torch.device | str | None = None,
    ) -> JanusVLNModel:
        """The model of a profile on ``device`` (default: the profile's), in its compute dtype.

        ``live=False`` never builds or loads VGGT (cached features only); ``live=True`` builds the
        frozen encoder too, for batches without features.
        """
        device = torch.device(device if device is not None else profile.device)
        qwen = load_qwen(profile.qwen, TORCH_DTYPES[profile.compute_dtype], attention_implementation(device))
        encoder = WindowEncoder.from_settings(profile.vggt, profile.cache, device) if live else None
        return cls(qwen, vggt_feature_dim(profile.vggt), config, encoder).to(device)

    # --------------------------------------------------------------------- trainable / groups

    def set_trainable(self, trainable: TrainableParts) -> None:
        """Freeze or unfreeze each part."""
        for name, param in self.named_parameters():
            param.requires_grad_(getattr(trainable, part_of(name)))

    def parameter_groups(
        self,
        lr_base: float = 2e-5,
        lr_projector: float = 1e-5,
        lr_vision: float = 1e-6,
        weight_decay: float = 0.0,
    ) -> list[dict[str, Any]]:
        """Optimizer param groups of the trainable parameters: ``base`` (LLM, lm_head, action head),
        ``projector`` (Qwen ViT merger, VGGT merger) and ``vision`` (ViT blocks), each as
        ``{"name", "lr", "weight_decay", "params", "param_names"}``; groups without trainable
        parameters are left out."""
        lrs = {"base": lr_base, "projector": lr_projector, "vision": lr_vision}
        groups: dict[str, dict[str, Any]] = {
            name: {"name": name, "lr": lr, "weight_decay": weight_decay, "params": [], "param_names": []}
            for name, lr in lrs.items()
        }
        for name, param in self.named_parameters():
            if param.requires_grad:
                group = groups[LR_GROUP_OF_PART[part_of(name)]]
                group["params"].append(param)
                group["param_names"].append(name)
        return [group for group in groups.values() if group["params"]]

    def set_gradient_checkpointing(self, policy: bool | ActivationCheckpointing) -> None:
        """Recompute Qwen's decoder layer activations in the backward pass: all layers (``True``),
        none (``False``) or as an :class:`ActivationCheckpointing` policy says (counting decoder
        layers only). The ViT blocks never recompute: frozen, they run outside autograd."""
        policy = ActivationCheckpointing.parse(policy) if isinstance(policy, bool) else policy
        policy.apply(self.qwen, self.qwen.model.language_model.layers)

    @property
    def gradient_checkpointing(self) -> bool:
        return bool(self.qwen.is_activation_checkpointing)

    @property
    def device(self) -> torch.device:
        return self.qwen.lm_head.weight.device

    # ------------------------------------------------------------------------------- forward

    def encode_features(self, frames: torch.Tensor) -> torch.Tensor:
        """Live VGGT features [B, N, 2C] (the encoder's feature dtype) of uint8 windows [B, S, H, W, 3]."""
        if self.encoder is None:
            raise ModelInputError("the model was built without a VGGT encoder (cached features only)")
        return self.encoder.encode(frames)

    def forward(self, batch: Mapping[str, torch.Tensor | None], return_hidden: bool = False) -> JanusOutput:
        """One micro-batch. ``batch`` holds the collated prompt tensors (see
        :func:`janus_train.data.prompt.collate_prompts`), ``frames`` uint8 [B, S, H, W, 3] and, for the
        cached path, ``features`` [B, N, 2C]."""
        device = self.device
        input_ids = _required(batch, "input_ids")
        attention_mask = _required(batch, "attention_mask")
        frames = _required(batch, "frames")
        if frames.dtype != torch.uint8 or frames.dim() != 5 or frames.shape[-1] != 3:
            raise ModelInputError(f"frames must be uint8 [B, S, H, W, 3], got {frames.dtype} {tuple(frames.shape)}")
        b, s, height, width, _ = frames.shape
        if input_ids.shape[0] != b:
            raise ModelInputError(f"input_ids hold {input_ids.shape[0]} samples but frames {b}")
        grid = self.base.patch_grid(height, width)
        token_grid = self.base.token_grid(height, width)
        self._check_image_pads(input_ids, s * token_grid[0] * token_grid[1])
        frames = frames.to(device, non_blocking=True)  # once, for the ViT and (live) for VGGT
        features = batch.get("features")
        if features is None:
            if self.encoder is None:
                raise ModelInputError(
                    "the batch has no 'features' and the model was built without a VGGT encoder; "
                    "pass cached features or build the model with live=True"
                )
            # Live: VGGT runs on its own frames of the sources (``vggt_frames``) where the base's
            # frames are not VGGT's (Qwen3-VL), else on the batch's frames.
            vggt_frames = batch.get("vggt_frames")
            if vggt_frames is None and self.base.patch_size != VGGT_PATCH_SIZE:
                raise ModelInputError(f"a live {self.base.name} batch needs 'vggt_frames' (VGGT's frames of the "
                                      "same sources, janus_train.data.samples.LiveFrames): VGGT does not run on "
                                      f"{self.base.name}'s frames")
            features = self.encode_features(frames if vggt_frames is None else vggt_frames.to(device))
        self._check_features(features, b, self.base.vggt_grid(height, width))

        image_embeds, deepstack = self.visual_embeddings(frames, features, batch.get("vit_features"))
        per_image = image_embeds.shape[2]
        inputs_embeds = self._embed_tokens(input_ids, image_embeds.view(b * s * per_image, -1))
        # DeepStack (Qwen3-VL): the ViT's intermediate features join the first LLM layers' hidden
        # states at the image pads, in the order the pads are filled (as Qwen3VLModel passes them).
        deepstack_inputs = {} if deepstack is None else {
            "visual_pos_masks": input_ids.to(device, non_blocking=True) == self.image_token_id,
            "deepstack_visual_embeds": [d.to(inputs_embeds.dtype) for d in deepstack],
        }

        # M-RoPE positions: built by the loader workers (janus_train.data.samples.collate), else here.
        position_ids = batch.get("position_ids")
        if position_ids is None:
            position_ids = RopeIndex(self.qwen.config)(input_ids, _required(batch, "mm_token_type_ids"),
                                                       attention_mask, grid, s)
        hidden = self.qwen.model.language_model(
            inputs_embeds=inputs_embeds,
            attention_mask=attention_mask.to(device, non_blocking=True),
            position_ids=position_ids.to(device, non_blocking=True),
            use_cache=False,
            **deepstack_inputs,
        ).last_hidden_state

        labels, segment_ids = _required(batch, "labels"), _required(batch, "segment_ids")
        token = token_cross_entropy(
            hidden, labels, segment_ids, _required(batch, "loss_weights"), self.qwen.lm_head,
            self.config.logit_chunk_rows,
        )
        positions = _required(batch, "action_positions").to(device, non_blocking=True)
        action_logits = self.action_head(hidden[torch.arange(b, device=device), positions]).float()
        action_ce, correct = action_cross_entropy(action_logits, _required(batch, "action_ids"))
        parts = LossParts(
            segment_ce_sum=token.ce_sum, segment_tokens=token.tokens, weighted_ce_sum=token.weighted_ce_sum,
            action_ce=action_ce, action_correct=correct, logit_rows=token.rows,
        )
        return JanusOutput(parts, action_logits, features, hidden if return_hidden else None)

    def image_embeddings(self, frames: torch.Tensor, features: torch.Tensor,
                         vit_features: torch.Tensor | None = None) -> torch.Tensor:
        """The fused image embeddings the LLM sees, [B, S, T, hidden] (see :func:`fuse_image_embeddings`)."""
        return self.visual_embeddings(frames, features, vit_features)[0]

    def visual_embeddings(self, frames: torch.Tensor, features: torch.Tensor, vit_features: torch.Tensor | None = None
                          ) -> tuple[torch.Tensor, list[torch.Tensor] | None]:
        """The fused image embeddings [B, S, T, hidden] and, for a DeepStack base, the ViT's
        DeepStack embeddings (one [B*S*T, hidden] per layer it feeds; else None)."""
        frames = frames.to(self.device, non_blocking=True)
        if not self.base.deepstack:
            return fuse_image_embeddings(self.qwen.model.visual, self.vggt_merger, self.config.lam,
                                         frames, features, vit_features), None
        return fuse_deepstack_image_embeddings(self.qwen.model.visual, self.vggt_merger, self.config.lam,
                                               frames, features, self.base, vit_features)

    def _check_features(self, features: torch.Tensor, batch: int, grid: tuple[int, int]) -> None:
        expected = (batch, grid[0] * grid[1], self.feature_dim)
        if tuple(features.shape) != expected:
            raise ModelInputError(
                f"features have shape {tuple(features.shape)}, expected {list(expected)} "
                f"(batch, {grid[0]}x{grid[1]} VGGT patches for the frames' visual tokens, feature width)"
            )

    def _check_image_pads(self, input_ids: torch.Tensor, pads_per_sample: int) -> None:
        pads = (input_ids == self.image_token_id).sum(1)
        if not bool((pads == pads_per_sample).all()):
            raise ModelInputError(
                f"image-pad tokens per sample {pads.tolist()} do not match the frames "
                f"({pads_per_sample} = images x visual tokens per image)"
            )

    def _embed_tokens(self, input_ids: torch.Tensor, image_embeds: torch.Tensor) -> torch.Tensor:
        """Token embeddings with the image pads replaced by ``image_embeds`` (in sequence order)."""
        ids = input_ids.to(self.device, non_blocking=True)
        embeds = self.qwen.model.get_input_embeddings()(ids)
        # masked_scatter fills the pads row by row, so sample i's pads take rows of sample i only
        # (every sample has the same pad count, checked by _check_image_pads).
        mask = (ids == self.image_token_id).unsqueeze(-1)
        return embeds.masked_scatter(mask, image_embeds.to(embeds.dtype))


def fuse_image_embeddings(visual: nn.Module, merger: VGGTMerger, lam: float, frames: torch.Tensor,
                          features: torch.Tensor, vit_features: torch.Tensor | None = None) -> torch.Tensor:
    """Qwen's ViT embeddings of each uint8 frame [B, S, H, W, 3] (pixel values built on the frames'
    device) plus ``lam * merger(feature)`` of that frame's own sample (features [B, N, 2C]):
    [B, S, T, hidden]. ``visual`` is Qwen2.5-VL's vision tower; the model and the reference
    checkpoint check (:mod:`janus_train.checkpoint.reference`) both fuse through here.

    With ``vit_features`` (the frames' cached ViT output [B, S, grid tokens, D],
    ``cache.vit_features``) only the tower's trainable merger runs: no pixel values, no ViT blocks
    (:mod:`janus_core.qwen_vit` computes both paths)."""
    b, s, height, width, _ = frames.shape
    grid = grid_shape(height, width)
    if vit_features is not None:
        image_embeds, _ = _merge_cached_vit(visual, DEFAULT_BASE, vit_features, (b, s), grid, frames.device)
    else:
        pixel_values, image_grid_thw = qwen_pixel_values(frames.reshape(b * s, height, width, 3))
        # As Qwen's get_image_features: pixel values in the tower's dtype, all images in one pass.
        image_embeds = vit_embeddings(visual, pixel_values.type(visual.dtype), image_grid_thw)
    per_image = image_embeds.shape[0] // (b * s)
    merger_dtype = merger.norm.weight.dtype
    vggt_embeds = merger(features.to(frames.device, merger_dtype, non_blocking=True), grid)
    if vggt_embeds.shape[1] != per_image:
        raise ModelInputError(f"the VGGT merger gives {vggt_embeds.shape[1]} tokens per sample, Qwen's ViT {per_image} per image")
    # Per sample: sample i's 3-D embedding goes to the S images of sample i only.
    return image_embeds.view(b, s, per_image, -1) + lam * vggt_embeds.unsqueeze(1).to(image_embeds.dtype)


def fuse_deepstack_image_embeddings(visual: nn.Module, merger: VGGTMerger, lam: float, frames: torch.Tensor,
                                    features: torch.Tensor, base: QwenBase, vit_features: torch.Tensor | None = None
                                    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """:func:`fuse_image_embeddings` for a DeepStack base (Qwen3-VL): the ViT's main embeddings of
    each uint8 frame [B, S, H, W, 3] plus ``lam * merger(feature)`` of its own sample, [B, S, T,
    hidden], and the ViT's DeepStack embeddings unchanged (one [B*S*T, hidden] per layer, image
    order). ``features`` [B, N, 2C] lie on :meth:`QwenBase.vggt_grid` of the frames.

    The whole tower runs as ``Qwen3VLModel.get_image_features`` runs it (all images in one pass);
    its frozen blocks record no graph (no input or weight of theirs needs a gradient). With
    ``vit_features`` (the frames' cached blocks' output [B, S, levels, grid tokens, D],
    ``cache.vit_features``) only the trainable mergers run, on the same rows the live blocks give them."""
    b, s, height, width, _ = frames.shape
    if vit_features is not None:
        image_embeds, deepstack = _merge_cached_vit(visual, base, vit_features, (b, s),
                                                    base.patch_grid(height, width), frames.device)
    else:
        pixel_values, image_grid_thw = qwen_pixel_values(frames.reshape(b * s, height, width, 3), base=base)
        out = visual(pixel_values.type(visual.dtype), grid_thw=image_grid_thw, return_dict=True)
        image_embeds, deepstack = out.pooler_output, list(out.deepstack_features)
    per_image = image_embeds.shape[0] // (b * s)
    vggt_embeds = merger(features.to(frames.device, merger.norm.weight.dtype, non_blocking=True),
                         base.vggt_grid(height, width))
    if vggt_embeds.shape[1] != per_image:
        raise ModelInputError(f"the VGGT merger gives {vggt_embeds.shape[1]} tokens per sample, {base.name}'s ViT "
                              f"{per_image} per image")
    fused = image_embeds.view(b, s, per_image, -1) + lam * vggt_embeds.unsqueeze(1).to(image_embeds.dtype)
    return fused, deepstack


def _refuse_training_tower(visual: nn.Module) -> None:
    if vision_tower_trains(visual):
        raise ModelInputError("the batch has cached vit_features but the vision tower trains (its blocks would "
                              "get no gradient); set cache.vit_features: false or freeze the vision tower")


def _merge_cached_vit(visual: nn.Module, base: QwenBase, vit_features: torch.Tensor, frames: tuple[int, int],
                      grid: tuple[int, int], device: torch.device) -> tuple[torch.Tensor, list[torch.Tensor] | None]:
    """The mergers' embeddings (main [B*S*T, hidden]; a DeepStack base's one per DeepStack layer too)
    of cached ViT features [B, S, *feature shape] (:meth:`QwenBase.vit_feature_shape`)."""
    (b, s) = frames
    expected = (b, s, *base.vit_feature_shape(visual.config, grid[0] * grid[1]))
    if tuple(vit_features.shape) != expected:
        raise ModelInputError(f"vit_features have shape {tuple(vit_features.shape)}, expected {list(expected)} "
                              f"(batch, frames, {base.vit_feature_dims})")
    _refuse_training_tower(visual)
    return merge_cached_output(visual, base, vit_features.to(device, non_blocking=True).flatten(0, 1), grid)


def vision_tower_trains(visual: nn.Module) -> bool:
    """Whether any parameter of Qwen's ViT outside its mergers (the projector) trains."""
    return any(p.requires_grad for name, p in visual.named_parameters()
               if not name.startswith(VIT_TRAINABLE_PREFIXES))


def vit_embeddings(visual: nn.Module, pixel_values: torch.Tensor, grid_thw: torch.Tensor, **layout: Any) -> torch.Tensor:
    """Qwen's image embeddings (its ViT's ``pooler_output``). A frozen vision tower runs outside
    autograd: no graph, no saved activations, nothing in the backward, whatever hook a library put
    on its input embedding; only the trainable patch merger records its graph."""
    if vision_tower_trains(visual):
        return vit_merge(visual, *vit_blocks(visual, pixel_values, grid_thw, **layout))
    with torch.no_grad():
        hidden, window_index = vit_blocks(visual, pixel_values, grid_thw, **layout)
    return vit_merge(visual, hidden, window_index)


def _required(batch: Mapping[str, torch.Tensor | None], name: str) -> torch.Tensor:
    value = batch.get(name)
    if value is None:
        raise ModelInputError(f"the batch has no '{name}'")
    return value
