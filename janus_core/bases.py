"""The base models janus trains JanusVLN on, and each base's facts, defined here once.

A *base* is a Qwen vision-language family whose processor and model janus must reproduce exactly:
Qwen2.5-VL (what JanusVLN ships) and Qwen3-VL (dense 2B/4B/8B). The facts below are transformers
5.24's own (``models/qwen2_5_vl`` and ``models/qwen3_vl``: configuration defaults, the Qwen2-VL
image processor both use, ``get_rope_index``, the vision tower's forward) and those of the
published checkpoints' ``preprocessor_config.json``. The frame pipeline, the prompt, the model,
the M-RoPE ids and the tiny-model generator read them from a :class:`QwenBase`; nothing else in
janus names a base's patch size, merge, normalisation or transformers classes.

Which base a run uses is decided in one place, :func:`base_of_qwen_dir`: the ``model_type`` of the
Qwen directory's ``config.json`` (``qwen.path``). A setting could only disagree with the checkpoint.

What differs (transformers' code):

* **Patch geometry.** Qwen2.5-VL: 14-px patches, 2x2 merge, so one visual token covers 28 px.
  Qwen3-VL: 16-px patches, 2x2 merge, 32 px per token. Both embed ``temporal_patch_size = 2``
  frames per patch (a still image is duplicated) and order the processor's rows by 2x2 merge block.
* **Normalisation.** Qwen2.5-VL: the OpenAI CLIP mean/std. Qwen3-VL: mean = std = 0.5 per channel.
* **ViT.** Qwen3-VL's tower adds learned position embeddings (bilinearly interpolated to the grid)
  and **DeepStack**: the outputs of blocks ``deepstack_visual_indexes`` pass their own mergers and
  are added to the hidden states of the first ``len(indexes)`` LLM layers at the visual positions
  (``Qwen3VLTextModel(visual_pos_masks=..., deepstack_visual_embeds=...)``). Qwen2.5-VL has
  windowed attention and no DeepStack.
* **M-RoPE.** Each base's ``Qwen*Model.get_rope_index`` (Qwen3-VL interleaves T/H/W frequencies,
  a property of its rotary embedding; the position ids of a still image are built alike).
* **Chat.** Both use the same special tokens and the ``<|im_start|>role\\n...<|im_end|>\\n`` turns
  (:mod:`janus_core.qwen_vision`); Qwen3-VL's template adds no default system turn when a
  conversation has none (janus's prompts always have one).

VGGT grid <-> Qwen token grid (see docs/bases.md)
-------------------------------------------------
The VGGT merger groups 2x2 VGGT patches (14 px) into one 3-D embedding per visual token. For
Qwen2.5-VL the frames are one resolution for both models (14-px patches on both sides). For
Qwen3-VL a token spans 32 px, so janus runs each model at its own resolution of the same source
frame: Qwen3-VL at ``pad{T}`` (T a multiple of 32) and VGGT at ``pad{T * 14 / 16}`` -- both grids
then have ``T/16`` patches a side and the 2x2-grouped VGGT grid equals Qwen's token grid (e.g.
Qwen ``pad640`` <-> VGGT ``pad560``: 40x40 patches, 20x20 = 400 tokens; the tiny tests: ``pad64``
<-> ``pad56``). No feature is resampled. :meth:`QwenBase.vggt_side` is that rule;
:func:`janus_core.imaging.load_qwen_frame` makes the Qwen3-VL frame paired with a VGGT frame.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

VGGT_PATCH_SIZE: int = 14
"""VGGT's (DINOv2's) patch side in pixels: the grid its features come on, whatever the base."""


class BaseError(ValueError):
    """A Qwen directory is not of a base janus knows; the message names the file and the fix."""


@dataclass(frozen=True)
class QwenBase:
    """One base model's facts (see the module docstring)."""

    name: str
    """Human name, e.g. ``Qwen2.5-VL``."""
    model_type: str
    """``config.json``'s ``model_type``: how a checkpoint says which base it is."""
    patch_size: int
    """Side of one ViT patch in pixels."""
    merge_size: int
    """The ViT merger joins ``merge_size x merge_size`` neighbouring patches into one visual token."""
    temporal_patch: int
    """Frames per patch embedding; a still image is duplicated to fill it."""
    image_mean: tuple[float, float, float]
    image_std: tuple[float, float, float]
    model_class: str
    """transformers' ``...ForConditionalGeneration`` class of the base."""
    inner_model_class: str
    """transformers' ``...Model`` class (owner of ``get_rope_index``)."""
    vision_class: str
    """transformers' vision tower class."""
    processor_class: str
    """transformers' processor class named in the checkpoint's preprocessor config."""
    deepstack: bool
    """Whether the vision tower feeds intermediate-layer features to the first LLM layers."""
    position_embedding_mode: str
    """How the ViT knows where a patch is: ``rope`` (2-D rotary only) or ``learned+rope``."""

    @property
    def token_pixels(self) -> int:
        """Pixels per visual token along one side (28 for Qwen2.5-VL, 32 for Qwen3-VL)."""
        return self.patch_size * self.merge_size

    @property
    def patch_dim(self) -> int:
        """Length of one flattened processor row: channels x temporal x patch x patch."""
        return 3 * self.temporal_patch * self.patch_size * self.patch_size

    def patch_grid(self, height: int, width: int) -> tuple[int, int]:
        """The ViT's patch grid ``(h, w)`` of a ``height x width`` frame; both sides must be whole
        visual tokens (multiples of :attr:`token_pixels`): the processor would otherwise resize."""
        side = self.token_pixels
        if height <= 0 or width <= 0 or height % side or width % side:
            raise ValueError(
                f"frame size {height}x{width} (HxW) is not whole {self.name} visual tokens: both sides must be "
                f"positive multiples of {side} px ({self.patch_size}-px patches, {self.merge_size}x{self.merge_size} merge)"
            )
        return height // self.patch_size, width // self.patch_size

    def token_grid(self, height: int, width: int) -> tuple[int, int]:
        """Visual tokens ``(h, w)`` of a ``height x width`` frame."""
        h, w = self.patch_grid(height, width)
        return h // self.merge_size, w // self.merge_size

    def vggt_grid(self, height: int, width: int) -> tuple[int, int]:
        """The VGGT patch grid whose 2x2 grouping gives this frame's token grid (the merger's input)."""
        h, w = self.token_grid(height, width)
        return h * self.merge_size, w * self.merge_size

    def vggt_side(self, qwen_side: int) -> int:
        """VGGT's frame side for a Qwen frame side (the grid rule above): ``qwen_side`` for
        Qwen2.5-VL, ``qwen_side * 14 / 16`` for Qwen3-VL (640 -> 560)."""
        if qwen_side <= 0 or qwen_side % self.token_pixels:
            raise ValueError(f"a {self.name} frame side must be a positive multiple of {self.token_pixels} px, "
                             f"got {qwen_side}")
        return qwen_side // self.patch_size * VGGT_PATCH_SIZE

    def frame_shape(self, vggt_height: int, vggt_width: int) -> tuple[int, int]:
        """The base's frame ``(H, W)`` paired with a VGGT frame of ``vggt_height x vggt_width`` (the
        grid rule above: the same patch counts, in the base's patches; 224x224 -> 256x256 for
        Qwen3-VL), checked to be whole visual tokens."""
        height = vggt_height // VGGT_PATCH_SIZE * self.patch_size
        width = vggt_width // VGGT_PATCH_SIZE * self.patch_size
        self.patch_grid(height, width)
        return height, width

    def vit_feature_shape(self, vision_config: Any, tokens: int) -> tuple[int, ...]:
        """One frame's cached ViT output (``cache.vit_features``) for a tower of ``vision_config``:
        ``(tokens, D)``; a DeepStack base stores a level more per DeepStack layer, ``(levels, tokens,
        D)``: the last block's output, then each DeepStack merger's input."""
        shape = (tokens, int(vision_config.hidden_size))
        return (1 + len(vision_config.deepstack_visual_indexes), *shape) if self.deepstack else shape

    @property
    def vit_feature_dims(self) -> str:
        """What the dimensions of :meth:`vit_feature_shape` are, for messages."""
        return ("ViT levels: last block + DeepStack layers, " if self.deepstack else "") + \
            "patches per frame, ViT hidden size"

    @property
    def modeling_module(self) -> str:
        """The transformers module that defines this base's classes (importing it takes seconds)."""
        return f"transformers.models.{self.model_type}.modeling_{self.model_type}"

    def transformers_class(self, which: str = "model") -> Any:
        """The transformers class: ``model`` (for-conditional-generation), ``inner`` or ``vision``."""
        import transformers  # noqa: PLC0415 - heavy; only model code needs it

        name = {"model": self.model_class, "inner": self.inner_model_class, "vision": self.vision_class}[which]
        if hasattr(transformers, name):
            return getattr(transformers, name)
        module = __import__(self.modeling_module, fromlist=[name])
        return getattr(module, name)


QWEN2_5_VL = QwenBase(
    name="Qwen2.5-VL",
    model_type="qwen2_5_vl",
    patch_size=14,
    merge_size=2,
    temporal_patch=2,
    # The OpenAI CLIP constants, as in Qwen2.5-VL's preprocessor_config.json.
    image_mean=(0.48145466, 0.4578275, 0.40821073),
    image_std=(0.26862954, 0.26130258, 0.27577711),
    model_class="Qwen2_5_VLForConditionalGeneration",
    inner_model_class="Qwen2_5_VLModel",
    vision_class="Qwen2_5_VisionTransformerPretrainedModel",
    processor_class="Qwen2_5_VLProcessor",
    deepstack=False,
    position_embedding_mode="rope",
)

QWEN3_VL = QwenBase(
    name="Qwen3-VL",
    model_type="qwen3_vl",
    patch_size=16,
    merge_size=2,
    temporal_patch=2,
    # Qwen3-VL's preprocessor_config.json (the Qwen2-VL image processor with mean = std = 0.5).
    image_mean=(0.5, 0.5, 0.5),
    image_std=(0.5, 0.5, 0.5),
    model_class="Qwen3VLForConditionalGeneration",
    inner_model_class="Qwen3VLModel",
    vision_class="Qwen3VLVisionModel",
    processor_class="Qwen3VLProcessor",
    deepstack=True,
    position_embedding_mode="learned+rope",
)

BASES: dict[str, QwenBase] = {base.model_type: base for base in (QWEN2_5_VL, QWEN3_VL)}
"""Every base janus supports, by ``model_type``."""

DEFAULT_BASE: QwenBase = QWEN2_5_VL
"""The base of JanusVLN's released checkpoints (and of the ``tiny`` profile)."""

def base_of_model_type(model_type: str, where: str = "the Qwen config") -> QwenBase:
    """The base of a ``model_type``; an unknown one is one line naming the known ones."""
    base = BASES.get(model_type)
    if base is None:
        known = ", ".join(f"{b.model_type} ({b.name})" for b in BASES.values())
        raise BaseError(f"{where}: model_type {model_type!r} is not a base janus supports; expected one of {known}")
    return base


def base_of_config(config: Any) -> QwenBase:
    """The base of a loaded transformers config (its ``model_type``)."""
    return base_of_model_type(str(getattr(config, "model_type", "")))


def base_of_qwen_dir(qwen_dir: str | Path) -> QwenBase:
    """The base of a Qwen directory, from its ``config.json``'s ``model_type`` (no weights read):
    the one place that decides which base a run uses."""
    path = Path(qwen_dir) / "config.json"
    try:
        model_type = json.loads(path.read_text(encoding="utf-8")).get("model_type")
    except FileNotFoundError:
        raise BaseError(f"{path}: no such file; 'qwen.path' must be a Qwen2.5-VL or Qwen3-VL directory") from None
    except (OSError, ValueError, AttributeError) as err:
        raise BaseError(f"{path}: not a readable JSON config ({err}); restore the checkpoint's config.json") from None
    return base_of_model_type(str(model_type), str(path))


def cache_base(qwen_dir: str | Path) -> QwenBase:
    """The base whose frames a cache for ``qwen.path`` holds (precompute) or must hold (training,
    verify): :func:`base_of_qwen_dir`, or Qwen2.5-VL when the directory has no ``config.json`` (a
    precompute needs no Qwen model; what does need it reports a missing one itself)."""
    if not (Path(qwen_dir) / "config.json").is_file():
        return DEFAULT_BASE
    return base_of_qwen_dir(qwen_dir)
