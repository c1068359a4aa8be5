"""The chat facts of the Qwen tokenizer that janus must match exactly: its special tokens and the
default system turn. Qwen2.5-VL and Qwen3-VL share them (their tokenizers give these tokens the same
ids); each base's own facts (patch geometry, normalisation, classes) live in
:mod:`janus_core.bases`.
"""

from __future__ import annotations

# Special tokens of the Qwen2.5-VL / Qwen3-VL tokenizer.
ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
VISION_START = "<|vision_start|>"
VISION_END = "<|vision_end|>"
IMAGE_PAD = "<|image_pad|>"
VIDEO_PAD = "<|video_pad|>"
QWEN_SPECIAL_TOKENS: tuple[str, ...] = (
    ENDOFTEXT,
    IM_START,
    IM_END,
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    VISION_START,
    VISION_END,
    "<|vision_pad|>",
    IMAGE_PAD,
    VIDEO_PAD,
)
"""All of them, in Qwen's id order (from 151643 in the real vocabulary)."""

DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant."
"""The system turn Qwen2.5-VL's chat template adds when a conversation has none (the reference's)."""
