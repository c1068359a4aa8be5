"""Facts of Qwen2.5-VL that janus must match exactly: patch geometry, image normalisation and the
special tokens of its tokenizer. Defined here once; the frame pipeline, the prompt, the model and
the tiny-model generator all read them from this module.
"""

from __future__ import annotations

#: Side of one ViT patch in pixels (Qwen2.5-VL and VGGT/DINOv2 both use 14).
PATCH_SIZE: int = 14
#: Qwen2.5-VL merges MERGE_SIZE x MERGE_SIZE neighbouring patches into one visual token.
MERGE_SIZE: int = 2
#: Qwen2.5-VL's patch embedding spans this many frames; a still image is duplicated to fill it.
TEMPORAL_PATCH: int = 2
#: Length of one flattened Qwen patch: channels x temporal x patch x patch (= 1176).
PATCH_DIM: int = 3 * TEMPORAL_PATCH * PATCH_SIZE * PATCH_SIZE

#: Qwen2.5-VL image processor normalisation (the OpenAI CLIP constants, as in the model's
#: preprocessor_config.json and transformers' Qwen2VLImageProcessor defaults).
QWEN_IMAGE_MEAN: tuple[float, float, float] = (0.48145466, 0.4578275, 0.40821073)
QWEN_IMAGE_STD: tuple[float, float, float] = (0.26862954, 0.26130258, 0.27577711)

# Special tokens of the Qwen2.5-VL tokenizer.
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
