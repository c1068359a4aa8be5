"""One training sample at a chosen shape, and the two ways of running a training step on it.

* **janus** (the cached path): the VGGT feature comes with the batch; ``pixel_values`` are built
  on the model's device from the uint8 frames and run through the frozen ViT outside autograd, or,
  for a batch with ``vit_features`` (the ViT cache), only the ViT's patch merger runs on those;
  token logits only at the supervised rows (:func:`janus_train.model.loss.token_cross_entropy`).
* **reference** (JanusVLN's way): VGGT runs on the window frame by frame with a key/value cache
  (all block pairs, as the reference forward does); ``pixel_values`` are built on the CPU and
  copied to the device; logits over the full vocabulary for every position, in float32.

For a Qwen3-VL base the Qwen frames are at the base's own resolution of the same source frame
(:meth:`SampleShape.frame_side`: 16-px patches on VGGT's 14-px patch grid), the ViT also returns
its DeepStack embeddings, which the LLM adds at the image positions of its first layers, and the
reference path's VGGT runs on frames at VGGT's resolution (``vggt_frames``), as the base's own
model and janus's grid rule do (docs/bases.md).

Both steps are composed from the real modules of a :class:`~janus_train.model.janus_model.JanusVLNModel` and
report each phase through a ``phase(name)`` context manager, so the same code is timed on a GPU
(``benchmarks.bench_gpu``) and FLOP-counted on the meta device (:mod:`benchmarks.flops`). The
batch is synthetic (random frames, features and token ids) but has the real layout: 9 image
blocks of ``<|vision_start|> + T x <|image_pad|> + <|vision_end|>``, text around them and a
supervised answer of four segments.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from janus_core.bases import VGGT_PATCH_SIZE, QwenBase
from janus_core.imaging import qwen_pixel_values
from janus_core.qwen_vit import merge_cached_output
from janus_core.resolution import visual_tokens_for_shape
from janus_core.vggt import VGGTAggregator
from janus_train.data.prompt import IGNORE_INDEX, N_SEGMENTS
from janus_train.data.rope import RopeIndex
from janus_train.model.janus_model import JanusVLNModel, vit_embeddings
from janus_train.model.loss import action_cross_entropy, token_cross_entropy

Phase = Callable[[str], contextlib.AbstractContextManager[None]]
"""``phase(name)``: a context manager around one phase of a step (timing, FLOP counting, nothing)."""

VisionOutput = tuple[torch.Tensor, list[torch.Tensor] | None]
"""Image embeddings [n*T, hidden] and, for a DeepStack base (Qwen3-VL), the ViT's DeepStack
embeddings (one [n*T, hidden] per LLM layer they join; None for Qwen2.5-VL)."""

VitRunner = Callable[[JanusVLNModel, torch.Tensor, torch.Tensor], VisionOutput]
"""Runs Qwen's ViT: ``(model, pixel_values, image_grid_thw) -> (image embeddings, DeepStack embeddings)``."""

VggtRunner = Callable[[torch.Tensor], torch.Tensor]
"""The reference step's VGGT: uint8 frames [1, S, H, W, 3] on the device -> feature [1, N, 2C]."""

PATHS: tuple[str, ...] = ("janus", "reference")
VGGT_LAYER = -2
"""The aggregator output JanusVLN consumes."""


@dataclass(frozen=True)
class SampleShape:
    """The real sample: 9 images of 644x644 (529 visual tokens each) and ~300 text tokens, of which
    ``answer_tokens`` are supervised: ~5.1k tokens in all. ``side`` is VGGT's frame side (and
    Qwen2.5-VL's); a base with other patches sees the same source at :meth:`frame_side`, with the
    same visual tokens (janus's grid rule, docs/bases.md)."""

    images: int = 9
    side: int = 644
    prompt_tokens: int = 150
    instruction_tokens: int = 50
    answer_tokens: int = 100

    @property
    def visual_tokens(self) -> int:
        return visual_tokens_for_shape(self.side, self.side)

    def frame_side(self, base: QwenBase) -> int:
        """The Qwen frame side of ``base`` for VGGT frames of ``side``: one Qwen patch per VGGT
        patch (644 for Qwen2.5-VL, 736 for Qwen3-VL at the real shape)."""
        return self.side // VGGT_PATCH_SIZE * base.patch_size

    @property
    def sequence_length(self) -> int:
        return self.prompt_tokens + self.images * (self.visual_tokens + 2) + self.instruction_tokens + self.answer_tokens


def no_phase(name: str) -> contextlib.AbstractContextManager[None]:
    return contextlib.nullcontext()


def make_batch(model: JanusVLNModel, shape: SampleShape, seed: int = 0, vit_cache: bool = False) -> dict[str, torch.Tensor]:
    """A one-sample micro-batch of the layout :meth:`JanusVLNModel.forward` takes, on the CPU (as a
    loader delivers it): random uint8 frames and VGGT feature, token ids with the model's special
    tokens, an answer of ``N_SEGMENTS`` equal segments; ``vit_cache``: the frames' ViT output too
    (``vit_features`` [1, S, grid tokens, ViT hidden]; a DeepStack base's [1, S, levels, grid tokens,
    ViT hidden], as the ViT cache delivers it). Frames are at
    the model's base's :meth:`SampleShape.frame_side`; where that is not VGGT's side, the batch
    also holds ``vggt_frames`` at VGGT's side (what the reference path's VGGT runs on)."""
    config, base = model.qwen.config, model.base
    side = shape.frame_side(base)
    generator = torch.Generator().manual_seed(seed)
    # Ordinary text ids stay below the special tokens, which sit at the top of Qwen's vocabulary.
    text_top = min(config.image_token_id, config.vision_start_token_id, config.vision_end_token_id)

    def text(n: int) -> torch.Tensor:
        return torch.randint(0, text_top, (n,), generator=generator)

    block = torch.full((shape.visual_tokens + 2,), config.image_token_id)
    block[0], block[-1] = config.vision_start_token_id, config.vision_end_token_id
    answer = text(shape.answer_tokens)
    ids = torch.cat([text(shape.prompt_tokens), *[block] * shape.images, text(shape.instruction_tokens), answer])
    length = ids.numel()
    start = length - shape.answer_tokens
    labels = torch.full((length,), IGNORE_INDEX)
    labels[start:] = answer
    segment_ids = torch.zeros(length, dtype=torch.int64)
    segment_ids[start:] = 1 + torch.arange(shape.answer_tokens) * N_SEGMENTS // shape.answer_tokens
    loss_weights = (labels != IGNORE_INDEX).float()
    grid, vggt_grid = base.patch_grid(side, side), base.vggt_grid(side, side)
    features = torch.randn(1, vggt_grid[0] * vggt_grid[1], model.feature_dim, generator=generator)
    attention_mask = torch.ones(1, length, dtype=torch.int64)
    mm_token_type_ids = (ids == config.image_token_id).long()[None]
    extra = {}
    if vit_cache:
        visual = model.qwen.model.visual
        extra["vit_features"] = torch.randn(1, shape.images, *base.vit_feature_shape(visual.config, grid[0] * grid[1]),
                                            generator=generator).to(visual.dtype)
    if side != shape.side:
        extra["vggt_frames"] = torch.randint(0, 256, (1, shape.images, shape.side, shape.side, 3), dtype=torch.uint8,
                                             generator=generator)
    return {
        **extra,
        "input_ids": ids[None],
        "attention_mask": attention_mask,
        "labels": labels[None],
        "segment_ids": segment_ids[None],
        "loss_weights": loss_weights[None],
        "mm_token_type_ids": mm_token_type_ids,
        # As janus's loader workers build them (janus_train.data.samples.collate).
        "position_ids": RopeIndex(config)(ids[None], mm_token_type_ids, attention_mask, grid, shape.images),
        "action_positions": torch.tensor([start - 1]),
        "action_ids": torch.tensor([0]),
        "frames": torch.randint(0, 256, (1, shape.images, side, side, 3), dtype=torch.uint8, generator=generator),
        "features": features.to(torch.bfloat16),
    }


def run_vit(model: JanusVLNModel, pixel_values: torch.Tensor, grid_thw: torch.Tensor) -> VisionOutput:
    """Qwen's ViT as the model runs it: Qwen2.5-VL's frozen blocks outside autograd, window
    attention, 2x2 merger; Qwen3-VL's whole tower as ``Qwen3VLModel.get_image_features`` runs it
    (:func:`janus_train.model.janus_model.fuse_deepstack_image_embeddings`), with its DeepStack embeddings."""
    visual = model.qwen.model.visual
    if model.base.deepstack:
        out = visual(pixel_values.type(visual.dtype), grid_thw=grid_thw, return_dict=True)
        return out.pooler_output, list(out.deepstack_features)
    return vit_embeddings(visual, pixel_values.type(visual.dtype), grid_thw), None


def merge_vit_cache(model: JanusVLNModel, vit_features: torch.Tensor, grid: tuple[int, int]) -> VisionOutput:
    """The ViT cache's path as the model runs it (:func:`janus_core.qwen_vit.merge_cached`): only
    the patch merger, on cached ViT output [B, S, grid tokens, D]: [B*S*T, hidden] (Qwen2.5-VL); a
    DeepStack base's [B, S, levels, grid tokens, D] through the patch and DeepStack mergers
    (:func:`janus_core.qwen_vit.merge_cached_deepstack`), with its DeepStack embeddings."""
    frames = vit_features.flatten(0, 1).to(model.device, non_blocking=True)
    return merge_cached_output(model.qwen.model.visual, model.base, frames, grid)


@dataclass
class StepRunner:
    """Runs one step of either path on a model; the reference path also needs ``vggt`` (an
    aggregator, run by :func:`stream_window_features`) or a ``reference_vggt`` runner."""

    model: JanusVLNModel
    vggt: VGGTAggregator | None = None
    vit: VitRunner = run_vit
    reference_vggt: VggtRunner | None = None

    @property
    def device(self) -> torch.device:
        return self.model.device

    def loss(self, path: str, batch: dict[str, torch.Tensor], phase: Phase = no_phase) -> torch.Tensor:
        """The forward of ``path`` (``janus`` or ``reference``) to a scalar loss."""
        if path == "janus":
            return self.janus_loss(batch, phase)
        if path == "reference":
            return self.reference_loss(batch, phase)
        raise ValueError(f"unknown path {path!r}; expected one of {PATHS}")

    def step(self, path: str, batch: dict[str, torch.Tensor], phase: Phase = no_phase) -> float:
        """Forward + backward (no optimizer: its state lives sharded elsewhere); returns the loss."""
        loss = self.loss(path, batch, phase)
        with phase("backward"):
            loss.backward()
        self.model.zero_grad(set_to_none=True)
        return float(loss.detach().float().cpu()) if loss.device.type != "meta" else float("nan")

    # ------------------------------------------------------------------------------ the paths

    def janus_loss(self, batch: dict[str, torch.Tensor], phase: Phase = no_phase) -> torch.Tensor:
        features = batch["features"]
        vit_features = batch.get("vit_features")
        base = self.model.base
        if vit_features is not None:  # the ViT cache: no pixel values, no ViT blocks
            grid = base.patch_grid(*batch["frames"].shape[2:4])
            return self._language_loss(batch, lambda: merge_vit_cache(self.model, vit_features, grid), features, phase,
                                       full_vocab=False)
        with phase("pixel_values"):
            frames = batch["frames"].to(self.device, non_blocking=True)
            pixel_values, grid_thw = qwen_pixel_values(frames.flatten(0, 1), base=base)
        return self._language_loss(batch, lambda: self.vit(self.model, pixel_values, grid_thw), features, phase,
                                   full_vocab=False)

    def reference_loss(self, batch: dict[str, torch.Tensor], phase: Phase = no_phase) -> torch.Tensor:
        if self.vggt is None and self.reference_vggt is None:
            raise ValueError("the reference path needs a VGGT aggregator (StepRunner.vggt)")
        with phase("vggt"):
            vggt_frames = batch.get("vggt_frames", batch["frames"])  # VGGT's own resolution
            features = self.stream_vggt(vggt_frames.to(self.device, non_blocking=True))
        with phase("pixel_values"):
            # The reference builds pixel_values on the CPU (its processor) and copies them over.
            pixel_values, grid_thw = qwen_pixel_values(batch["frames"].flatten(0, 1).cpu(), base=self.model.base)
            pixel_values = pixel_values.to(self.device, non_blocking=True)
            grid_thw = grid_thw.to(self.device)
        return self._language_loss(batch, lambda: self.vit(self.model, pixel_values, grid_thw), features, phase,
                                   full_vocab=True)

    def stream_vggt(self, frames: torch.Tensor) -> torch.Tensor:
        if self.reference_vggt is not None:
            return self.reference_vggt(frames)
        assert self.vggt is not None
        return stream_window_features(self.vggt, frames)

    def _language_loss(
        self,
        batch: dict[str, torch.Tensor],
        vit: Callable[[], VisionOutput],
        features: torch.Tensor,
        phase: Phase,
        full_vocab: bool,
    ) -> torch.Tensor:
        model, device = self.model, self.device
        b, s, height, width, _ = batch["frames"].shape
        grid = model.base.patch_grid(height, width)
        with phase("vit"):
            image_embeds, deepstack = vit()
        with phase("merger"):
            merger_dtype = model.vggt_merger.norm.weight.dtype
            vggt_embeds = model.vggt_merger(features.to(device, merger_dtype, non_blocking=True),
                                            model.base.vggt_grid(height, width))
            per_image = image_embeds.shape[0] // (b * s)
            fused = image_embeds.view(b, s, per_image, -1) + model.config.lam * vggt_embeds.unsqueeze(1).to(image_embeds.dtype)
            ids = batch["input_ids"].to(device, non_blocking=True)
            embeds = model.qwen.model.get_input_embeddings()(ids)
            mask = (ids == model.image_token_id).unsqueeze(-1)
            inputs_embeds = embeds.masked_scatter(mask, fused.reshape(-1, fused.shape[-1]).to(embeds.dtype))
            # DeepStack (Qwen3-VL): the ViT's intermediate embeddings join the first LLM layers at the
            # image positions, as JanusVLNModel.forward passes them.
            deepstack_inputs = {} if deepstack is None else {
                "visual_pos_masks": mask.squeeze(-1),
                "deepstack_visual_embeds": [d.to(inputs_embeds.dtype) for d in deepstack],
            }
        with phase("llm_forward"):
            # janus's loader workers build the M-RoPE positions with the batch; the reference's forward does.
            position_ids = batch.get("position_ids") if not full_vocab else None
            if position_ids is None:
                position_ids = RopeIndex(model.qwen.config)(batch["input_ids"], batch["mm_token_type_ids"],
                                                            batch["attention_mask"], grid, s)
            # No padding in a one-sample batch: a causal mask without a padding mask.
            hidden = model.qwen.model.language_model(
                inputs_embeds=inputs_embeds, position_ids=position_ids.to(device), attention_mask=None, use_cache=False,
                **deepstack_inputs,
            ).last_hidden_state
        with phase("logits"):
            if full_vocab:
                logits = model.qwen.lm_head(hidden).float()
                token_loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), batch["labels"][:, 1:].flatten().to(device),
                                             ignore_index=IGNORE_INDEX)
            else:
                parts = token_cross_entropy(hidden, batch["labels"], batch["segment_ids"], batch["loss_weights"],
                                            model.qwen.lm_head, model.config.logit_chunk_rows)
                token_loss = parts.weighted_ce_sum.sum() / batch["loss_weights"].sum().clamp_min(1)
            positions = batch["action_positions"].to(device)
            action_logits = model.action_head(hidden[torch.arange(b, device=device), positions]).float()
            action_ce, _ = action_cross_entropy(action_logits, batch["action_ids"])
        return token_loss + action_ce.mean()


def stream_window_features(vggt: VGGTAggregator, frames: torch.Tensor) -> torch.Tensor:
    """The reference's VGGT call: one frame at a time through all block pairs with a KV cache; the
    feature is the last frame's patch tokens at layer -2. ``frames`` uint8 [B, S, H, W, 3]."""
    images = frames.permute(0, 1, 4, 2, 3).float().div(255)
    cache = vggt.new_cache()
    outputs: list[torch.Tensor] = []
    for t in range(images.shape[1]):
        outputs = vggt.stream_step(images[:, t : t + 1], cache)
    return outputs[VGGT_LAYER][:, -1, vggt.config.patch_start_idx :]
