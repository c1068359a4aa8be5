"""FLOPs of one training step, per component, counted on any machine.

The models are built on PyTorch's meta device (shapes only: no memory, no arithmetic) from their
config files, and one step of each path of :mod:`benchmarks.workload` runs under
``torch.utils.flop_counter.FlopCounterMode``, one counter per phase. So the counts are of the very
code that runs in training and in the GPU bench, at the real 7B / VGGT-1B shapes, in seconds.

Components: ``vggt`` (the reference runs VGGT in every step; janus ran it once, in precompute),
``vit`` (the forward of Qwen's frozen ViT blocks and patch embedding; the same in both paths, none
with the ViT cache), ``vit_backward`` (what the backward and its recompute run through those
blocks: zero while the frozen ViT stays outside autograd), ``merger`` (Qwen's trainable ViT patch
merger, the VGGT merger and the embedding fusion), ``llm_forward``, ``logits`` (LM head +
losses), ``backward`` (without recomputation) and ``recompute`` (the extra forward that activation
checkpointing replays in the backward pass).

The ViT is counted as the model runs it (:func:`janus_train.model.janus_model.vit_embeddings`, in training
mode under the step's checkpointing policy), forward and backward, so a frozen ViT pulled into
autograd shows as ``vit_backward``. Two meta-device specifics: Qwen's ViT derives its window
layout from ``image_grid_thw`` values, which meta tensors do not have, so the ViT is counted once
at one image, with the layout computed on the CPU, and multiplied by the images of a sample
(images never attend to each other, so this is exact); inside the step the ViT contributes its
patch merger only, run on the blocks' output as the ViT cache gives it. Attention is counted as
PyTorch's counter counts it: dense (a causal mask's skipped half is not subtracted).

Either base (:mod:`janus_core.bases`) is counted from its config: for Qwen3-VL the ViT (16-px
patches, no windows, learned position embeddings resampled to the grid) is counted the same way,
with its layout (position ids, interpolation taps, sequence boundaries) computed on the CPU, and
its DeepStack mergers, trainable like the patch merger, count in ``merger`` (run in the step on
hidden states of the blocks' shape) with their backward in ``backward``; the LLM adds their
output at the image positions of its first layers. The ViT cache covers Qwen3-VL too (it holds
the DeepStack mergers' inputs): with it the blocks do not run and every merger still does.
"""

from __future__ import annotations

import contextlib
import functools
import json
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode
from transformers import AutoConfig, PretrainedConfig
from transformers.models.auto.configuration_auto import CONFIG_MAPPING
from transformers.vision_utils import (
    get_vision_cu_seqlens,
    get_vision_interpolation_indices_and_weights,
    get_vision_position_ids,
    get_vision_window_index,
)

from benchmarks.workload import (
    VGGT_LAYER,
    SampleShape,
    StepRunner,
    VisionOutput,
    make_batch,
    stream_window_features,
)
from janus_core.bases import DEFAULT_BASE, QwenBase, base_of_config
from janus_core.vggt import AggregatorConfig, VGGTAggregator, window_flops
from janus_train.model.activation_checkpointing import FULL, NONE, ActivationCheckpointing
from janus_train.model.janus_model import JanusModelConfig, JanusVLNModel, TrainableParts, vit_embeddings, vit_merge

COMPONENTS: tuple[str, ...] = ("vggt", "vit", "vit_backward", "merger", "llm_forward", "logits", "backward",
                               "recompute")
VIT_COMPONENTS = ("vit", "vit_backward")
"""What the frozen ViT blocks cost; neither runs with the ViT cache."""
META = torch.device("meta")


@dataclass(frozen=True)
class StepFlops:
    """FLOPs of one step of one path, per component (see :data:`COMPONENTS`)."""

    path: str
    components: dict[str, float]

    @property
    def total(self) -> float:
        return sum(self.components.values())

    @property
    def model_flops(self) -> float:
        """FLOPs the step needs without recomputation (the numerator of MFU)."""
        return self.total - self.components.get("recompute", 0.0)


@dataclass(frozen=True)
class FlopTable:
    """One janus step against one reference step at ``shape``."""

    shape: SampleShape
    checkpointing: str
    janus: StepFlops
    reference: StepFlops
    precompute_vggt: float
    """janus's VGGT window per sample, paid once in precompute (layer -2, batched, block-causal)."""
    models: dict[str, str] = field(default_factory=dict)
    base: QwenBase = DEFAULT_BASE

    @property
    def janus_vit_cache(self) -> StepFlops:
        """The janus step with the ViT cache (``cache.vit_features``): the ViT blocks do not run,
        only their mergers (the patch merger; Qwen3-VL's DeepStack mergers too), on the cached output
        (paid once per frame in precompute)."""
        return StepFlops("janus_vit_cache", {name: 0.0 if name in VIT_COMPONENTS else value
                                             for name, value in self.janus.components.items()})

    @property
    def ratio(self) -> float:
        """Reference FLOPs per step over janus FLOPs per step."""
        return self.reference.total / self.janus.total

    def to_dict(self) -> dict[str, object]:
        return {
            "shape": {**self.shape.__dict__, "sequence_length": self.shape.sequence_length,
                      "qwen_side": self.shape.frame_side(self.base)},
            "base": self.base.name,
            "checkpointing": self.checkpointing,
            "models": self.models,
            "janus": self.janus.components,
            "janus_vit_cache": self.janus_vit_cache.components,
            "reference": self.reference.components,
            "janus_total": self.janus.total,
            "janus_vit_cache_total": self.janus_vit_cache.total,
            "reference_total": self.reference.total,
            "precompute_vggt_per_sample": self.precompute_vggt,
            "ratio": self.ratio,
        }


class PhaseCounter:
    """A ``phase(name)`` for :class:`StepRunner` that counts the FLOPs of each phase."""

    def __init__(self) -> None:
        self.flops: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        counter = FlopCounterMode(display=False)
        with counter:
            yield
        self.flops[name] = self.flops.get(name, 0.0) + float(counter.get_total_flops())


def build_model(
    qwen: Path | PretrainedConfig, feature_dim: int, merger_hidden: int = 4096, device: torch.device = META,
    dtype: torch.dtype = torch.bfloat16, attn_implementation: str = "sdpa",
    trainable: TrainableParts | None = None,
) -> JanusVLNModel:
    """A JanusVLN model of the Qwen architecture ``qwen`` (a config, or a directory with its
    ``config.json``; either base), built directly on ``device`` (random weights; none on the meta
    device)."""
    config = qwen if isinstance(qwen, PretrainedConfig) else AutoConfig.from_pretrained(qwen, local_files_only=True)
    with torch.device(device):
        qwen = base_of_config(config).transformers_class()._from_config(config, dtype=dtype,
                                                                         attn_implementation=attn_implementation)
        model_config = JanusModelConfig(merger_hidden=merger_hidden, trainable=trainable or TrainableParts())
        model = JanusVLNModel(qwen, feature_dim, model_config)
    if device.type == "meta" and model.base.deepstack:
        text = model.qwen.model.language_model
        text._deepstack_process = types.MethodType(_meta_deepstack_process, text)
    return model


def _meta_deepstack_process(self: nn.Module, hidden_states: torch.Tensor, visual_pos_masks: torch.Tensor,
                            visual_embeds: torch.Tensor) -> torch.Tensor:
    """Qwen3-VL's DeepStack addition on the meta device, where a boolean mask has no values to select
    rows with: the embeddings are added to as many rows (one sample), so their gradient reaches the
    DeepStack mergers as in the real step. The addition itself is elementwise (no FLOPs counted)."""
    rows = torch.arange(visual_embeds.shape[0], device=hidden_states.device)
    return hidden_states.index_add(1, rows, visual_embeds.to(hidden_states.dtype)[None])


def build_vggt(config: AggregatorConfig, device: torch.device = META) -> VGGTAggregator:
    with torch.device(device):
        return VGGTAggregator.from_config(config)


def load_vggt_config(path: Path) -> AggregatorConfig:
    return AggregatorConfig.from_dict(json.loads(Path(path).read_text()))


def qwen_config(qwen_dir: Path, layers: int | None = None, vision: dict[str, object] | None = None) -> PretrainedConfig:
    """The config of ``qwen_dir`` (its base's config class), optionally with ``layers`` decoder
    layers and the ``vision`` entries of its vision config replaced (e.g. ``depth``)."""
    values = json.loads((Path(qwen_dir) / "config.json").read_text())
    if layers is not None:
        values["text_config"] = {**values["text_config"], "num_hidden_layers": layers}
    if vision is not None:
        values["vision_config"] = {**values["vision_config"], **vision}
    return CONFIG_MAPPING[values["model_type"]].from_dict(values)


def window_blocks(full: tuple[bool, ...]) -> dict[str, object]:
    """Qwen2.5-VL vision-config entries for ViT blocks ``full`` (True: a full-attention block, False:
    a window-attention block)."""
    return {"depth": len(full), "fullatt_block_indexes": [i for i, is_full in enumerate(full) if is_full]}


def qwen_base(qwen_dir: Path) -> QwenBase:
    return base_of_config(qwen_config(qwen_dir))


@dataclass(frozen=True)
class VitFlops:
    """FLOPs of Qwen's ViT without its patch merger: the forward, and what the backward (with its
    recompute) runs through it."""

    forward: float
    backward: float

    def __add__(self, other: VitFlops) -> VitFlops:
        return VitFlops(self.forward + other.forward, self.backward + other.backward)

    def __sub__(self, other: VitFlops) -> VitFlops:
        return VitFlops(self.forward - other.forward, self.backward - other.backward)

    def __mul__(self, factor: float) -> VitFlops:
        return VitFlops(self.forward * factor, self.backward * factor)


def vit_block_flops(qwen_dir: Path, shape: SampleShape, checkpointing: ActivationCheckpointing = NONE,
                    trainable: TrainableParts | None = None) -> VitFlops:
    """FLOPs of Qwen's ViT without its merger for the images of one sample, as a training step of a
    model with ``trainable`` parts under ``checkpointing`` runs it.

    Counted at one image (images never attend to each other) with the layout computed on the CPU.
    Qwen2.5-VL: for 1 window + 1 full-attention block, 2 + 1 and 1 + 2, extrapolated to the real
    numbers of each kind of block. Qwen3-VL (every block alike): for 1 and 2 blocks without
    DeepStack taps (their mergers are counted in the step), extrapolated to the real depth.
    """
    real = qwen_config(qwen_dir).vision_config

    def count(vision: dict[str, object]) -> VitFlops:
        model = build_model(qwen_config(qwen_dir, layers=1, vision=vision), 2, trainable=trainable)
        model.set_gradient_checkpointing(checkpointing)
        return vit_flops_one_image(model, shape)

    if qwen_base(qwen_dir).deepstack:
        one = count({"depth": 1, "deepstack_visual_indexes": []})
        per_block = count({"depth": 2, "deepstack_visual_indexes": []}) - one
        return (one + per_block * (real.depth - 1)) * shape.images
    n_full = len(real.fullatt_block_indexes)
    one_each = count(window_blocks((False, True)))
    window = count(window_blocks((False, False, True))) - one_each
    full = count(window_blocks((False, True, True))) - one_each
    return (one_each + window * (real.depth - n_full - 1) + full * (n_full - 1)) * shape.images


def vit_flops_one_image(model: JanusVLNModel, shape: SampleShape) -> VitFlops:
    """One image through the model's ViT in training mode (:func:`janus_train.model.janus_model.vit_embeddings`,
    the trainer's code; for Qwen3-VL the whole tower, as the model runs it): forward and backward
    FLOPs less those of the patch merger alone."""
    visual = model.qwen.model.visual
    model.train()
    vc = visual.config
    side = shape.frame_side(model.base)
    gh, gw = side // vc.patch_size, side // vc.patch_size
    grid = torch.tensor([[1, gh, gw]])
    if model.base.deepstack:
        return _deepstack_vit_flops_one_image(model, grid)
    window_index, cu_window_seqlens = get_vision_window_index(grid, vc.spatial_merge_size, vc.window_size, vc.patch_size)
    layout = {
        # Values the ViT would compute from grid_thw, given precomputed: index tensors on the model's
        # device, sequence boundaries on the CPU (they are read as Python numbers).
        "position_ids": get_vision_position_ids(grid, vc.spatial_merge_size).to(visual.device),
        "cu_seqlens": get_vision_cu_seqlens(grid),
        "window_index": window_index.to(visual.device),
        "cu_window_seqlens": cu_window_seqlens,
    }
    patch_dim = vc.in_channels * vc.temporal_patch_size * vc.patch_size**2
    pixel_values = torch.empty(gh * gw, patch_dim, device=visual.device, dtype=visual.dtype)
    hidden = torch.empty(gh * gw, vc.hidden_size, device=visual.device, dtype=visual.dtype)
    whole = _forward_backward_flops(lambda: vit_embeddings(visual, pixel_values, grid, **layout))
    merger = _forward_backward_flops(lambda: vit_merge(visual, hidden, layout["window_index"]))
    model.zero_grad(set_to_none=True)
    return whole - merger


def _deepstack_vit_flops_one_image(model: JanusVLNModel, grid: torch.Tensor) -> VitFlops:
    """:func:`vit_flops_one_image` for Qwen3-VL's tower: its layout (interpolation taps of the
    learned position embeddings, rotary position ids, sequence boundaries) computed on the CPU,
    since meta tensors have no values."""
    visual = model.qwen.model.visual
    vc = visual.config
    indices, weights = get_vision_interpolation_indices_and_weights(
        grid, num_grid_per_side=visual.num_grid_per_side, mode=visual.interpolation_mode,
        align_corners=visual.interpolation_align_corners, spatial_merge_size=vc.spatial_merge_size)
    cu_seqlens = get_vision_cu_seqlens(grid)
    layout = {
        "interp_indices": indices.to(visual.device),
        "interp_weights": weights.to(visual.device, visual.dtype),
        "position_ids": get_vision_position_ids(grid, vc.spatial_merge_size).to(visual.device),
        "cu_seqlens": cu_seqlens,
        "max_seqlen": int((cu_seqlens[1:] - cu_seqlens[:-1]).max()),
    }
    rows = int(grid.prod())
    pixel_values = torch.empty(rows, vc.in_channels * vc.temporal_patch_size * vc.patch_size**2,
                               device=visual.device, dtype=visual.dtype)
    hidden = torch.empty(rows, vc.hidden_size, device=visual.device, dtype=visual.dtype)
    whole = _forward_backward_flops(lambda: visual(pixel_values, grid_thw=grid, **layout).pooler_output)
    merger = _forward_backward_flops(lambda: visual.merger(hidden))
    # The DeepStack mergers ran in the tower's forward; like the patch merger they are counted in the
    # step (merger_only), not here.
    with FlopCounterMode(display=False) as deepstack:
        for deepstack_merger in visual.deepstack_merger_list:
            deepstack_merger(hidden)
    model.zero_grad(set_to_none=True)
    return whole - merger - VitFlops(float(deepstack.get_total_flops()), 0.0)


def _forward_backward_flops(forward: Callable[[], torch.Tensor]) -> VitFlops:
    with FlopCounterMode(display=False) as counted_forward:
        out = forward()
    with FlopCounterMode(display=False) as counted_backward:
        if out.requires_grad:
            out.sum().backward()
    return VitFlops(float(counted_forward.get_total_flops()), float(counted_backward.get_total_flops()))


def merger_only(model: JanusVLNModel, pixel_values: torch.Tensor, grid_thw: torch.Tensor) -> VisionOutput:
    """The ViT inside a meta-device step as the ViT cache runs it: its patch merger (and a Qwen3-VL
    tower's DeepStack mergers) on hidden states of the right shape (the blocks are counted by
    :func:`vit_block_flops`)."""
    visual = model.qwen.model.visual
    hidden = torch.empty(pixel_values.shape[0], visual.config.hidden_size, device=pixel_values.device,
                         dtype=visual.dtype)
    deepstack = [merger(hidden) for merger in visual.deepstack_merger_list] if model.base.deepstack else None
    return visual.merger(hidden), deepstack


@functools.cache  # the same count for every base and checkpointing policy a bench compares
def vggt_stream_flops(config: AggregatorConfig, shape: SampleShape) -> float:
    """FLOPs of the reference's per-frame VGGT loop over one window (all block pairs).

    Counted at 1 and 2 DINOv2 blocks and 2 and 3 aggregator block pairs and extrapolated linearly to
    the real depths: the blocks of a half all have the same shape, and counting the full 48-pair
    loop block by block on the meta device would take a minute.
    """
    frames = torch.empty(1, shape.images, shape.side, shape.side, 3, dtype=torch.uint8, device=META)

    def count(dino_depth: int, depth: int) -> float:
        small = replace(config, depth=depth, patch_embed=replace(config.patch_embed, depth=dino_depth))
        with FlopCounterMode(display=False) as counter:
            stream_window_features(build_vggt(small), frames)
        return float(counter.get_total_flops())

    base = count(1, 2)  # two pairs at least: the feature is read at pair -2
    per_dino_block, per_pair = count(2, 2) - base, count(1, 3) - base
    return base + (config.patch_embed.depth - 1) * per_dino_block + (config.depth - 2) * per_pair


def count_step(runner: StepRunner, path: str, batch: dict[str, torch.Tensor],
               checkpointing: ActivationCheckpointing) -> dict[str, float]:
    """Per-phase FLOPs of one step; ``recompute`` from the same step counted without checkpointing."""
    counted = {}
    for policy in (checkpointing, NONE) if checkpointing.enabled else (NONE,):
        runner.model.set_gradient_checkpointing(policy)
        runner.model.train()
        counter = PhaseCounter()
        runner.step(path, batch, counter)
        counted[policy.every] = counter.flops
    plain = counted[0]
    flops = {name: plain.get(name, 0.0) for name in COMPONENTS if name not in ("recompute", *VIT_COMPONENTS)}
    # The step's "vit" phase is the patch merger alone (the blocks: vit_block_flops).
    flops["merger"] += plain.get("vit", 0.0)
    flops.update(dict.fromkeys(VIT_COMPONENTS, 0.0))
    flops["recompute"] = counted[checkpointing.every]["backward"] - plain["backward"] if checkpointing.enabled else 0.0
    return flops


def count_flops(
    qwen_dir: Path,
    vggt_config: Path,
    shape: SampleShape = SampleShape(),
    checkpointing: ActivationCheckpointing = FULL,
    merger_hidden: int = 4096,
) -> FlopTable:
    """The FLOP table of one janus step and one reference step at ``shape`` (meta device).

    The steps are counted with 2 and 3 decoder layers and extrapolated to the real depth (every
    decoder layer has the same shape, so per-layer components grow exactly linearly); the ViT blocks
    and VGGT the same way (:func:`vit_block_flops`, :func:`vggt_stream_flops`). Checkpointing must
    be ``full`` or ``none`` (every K-th layer does not extrapolate from 2 layers).
    """
    if checkpointing.every > 1:
        raise ValueError(f"FLOPs are counted for full or no checkpointing, not {checkpointing}")
    aggregator = load_vggt_config(vggt_config)
    layers = qwen_config(qwen_dir).text_config.num_hidden_layers
    patches = (shape.side // aggregator.patch_size) ** 2
    base = qwen_base(qwen_dir)
    # One ViT block (the step runs its mergers only); a DeepStack tower keeps its real taps and so
    # all its DeepStack mergers.
    vision = {"depth": 1} if base.deepstack else window_blocks((True,))

    def counted(n_layers: int) -> dict[str, dict[str, float]]:
        model = build_model(qwen_config(qwen_dir, layers=n_layers, vision=vision), 2 * aggregator.embed_dim,
                            merger_hidden)

        def features(frames: torch.Tensor) -> torch.Tensor:  # counted by vggt_stream_flops
            return torch.empty(1, patches, model.feature_dim, device=META, dtype=torch.bfloat16)

        runner = StepRunner(model, vit=merger_only, reference_vggt=features)
        batch = make_batch(model, shape)
        return {path: count_step(runner, path, batch, checkpointing) for path in ("janus", "reference")}

    two, three = counted(2), counted(3)
    vit_blocks = vit_block_flops(qwen_dir, shape, checkpointing)
    steps = {}
    for path in ("janus", "reference"):
        flops = {name: two[path][name] + (layers - 2) * (three[path][name] - two[path][name]) for name in COMPONENTS}
        flops["vit"], flops["vit_backward"] = vit_blocks.forward, vit_blocks.backward
        if path == "reference":
            flops["vggt"] = vggt_stream_flops(aggregator, shape)
        steps[path] = StepFlops(path, flops)
    precompute = window_flops(aggregator, shape.side, shape.side, shape.images, last_layer=VGGT_LAYER)
    return FlopTable(shape, str(checkpointing), steps["janus"], steps["reference"], precompute,
                     {"qwen": Path(qwen_dir).name, "vggt": Path(vggt_config).name}, base)
