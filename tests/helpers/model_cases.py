"""Shared pieces of the prompt/model/loss tests: the tiny models and real micro-batches, of either
base (:mod:`helpers.bases`; Qwen2.5-VL unless a test names one).

Frames come from the session's sample dataset (real PNGs) at pad56: VGGT's 56x56 frame (4x4
patches), which is Qwen2.5-VL's, and Qwen3-VL's 64x64 frame of the same source (4x4 patches of 16
px); both are 4 visual tokens per image, so a 9-image prompt is ~300 tokens and a forward of the
tiny model takes milliseconds. The features are the tiny VGGT's of VGGT's frames.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from pathlib import Path

import numpy as np
import torch
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from helpers.bases import QWEN2_5, BaseCase
from janus_core.imaging import load_frame, load_qwen_frame
from janus_core.index import DatasetIndex, Sample
from janus_core.profile import CacheSettings, EncoderSettings, LanguageModelSettings
from janus_core.qwen_vit import ViTEncoder, load_vision_tower, vit_fingerprint
from janus_core.resolution import Resolution
from janus_core.vggt.encoder import WindowEncoder
from janus_train.data.prompt import PromptBuilder
from janus_train.model.janus_model import JanusModelConfig, JanusVLNModel, TrainableParts, load_qwen

REPO = Path(__file__).resolve().parents[2]
QWEN_DIR = QWEN2_5.qwen_dir
VGGT_CONFIG = REPO / "configs" / "models" / "tiny-vggt.json"
RESOLUTION = Resolution("pad", 56)
VISUAL_TOKENS = RESOLUTION.visual_tokens()  # 4
FEATURE_DIM = 128  # 2 x the tiny VGGT's embed_dim
MERGER_HIDDEN = 96  # the real 4096 would only slow the tests down


@cache
def tiny_tokenizer() -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(QWEN_DIR)


@cache
def builder() -> PromptBuilder:
    return PromptBuilder(tiny_tokenizer(), VISUAL_TOKENS)


@cache
def tiny_encoder() -> WindowEncoder:
    """The tiny profile's frozen VGGT (config + seed 0) at the test resolution."""
    settings = EncoderSettings(path=None, config=VGGT_CONFIG, seed=0)
    return WindowEncoder.from_settings(settings, CacheSettings(resolution=RESOLUTION))


def tiny_model(
    live: bool = False,
    lam: float = 0.2,
    trainable: TrainableParts | None = None,
    logit_chunk_rows: int = 1024,
    base: BaseCase = QWEN2_5,
) -> JanusVLNModel:
    """A fresh tiny JanusVLN model of ``base`` (random weights from seed 0), float32 on the CPU."""
    qwen = load_qwen(LanguageModelSettings(path=base.qwen_dir, random_init=True, seed=0))
    config = JanusModelConfig(
        lam=lam,
        merger_hidden=MERGER_HIDDEN,
        trainable=trainable if trainable is not None else TrainableParts(),
        logit_chunk_rows=logit_chunk_rows,
    )
    return JanusVLNModel(qwen, FEATURE_DIM, config, encoder=tiny_encoder() if live else None)


def tiny_vit(base: BaseCase = QWEN2_5) -> ViTEncoder:
    """The frozen ViT of ``base``'s tiny model as precompute builds it (seed 0, float32), one window per call."""
    visual = load_vision_tower(LanguageModelSettings(path=base.qwen_dir, random_init=True, seed=0))
    return ViTEncoder(visual, "float32", 9, vit_fingerprint(visual), base.qwen_dir.name, base.base)


def window_frames(index: DatasetIndex, sample: Sample) -> torch.Tensor:
    """VGGT's uint8 [S, 56, 56, 3] frames of a sample's window, decoded from the dataset's PNGs."""
    return torch.from_numpy(np.stack([load_frame(frame.path, RESOLUTION) for frame in index.window(sample)]))


def make_batch(index: DatasetIndex, samples: Sequence[Sample], with_features: bool = True,
               base: BaseCase = QWEN2_5) -> dict[str, torch.Tensor]:
    """A collated micro-batch of real samples: prompt tensors, ``base``'s frames and (optionally)
    the features the tiny encoder computes from VGGT's frames of the same sources, as a cache
    would hold them."""
    batch = builder().collate([builder().build_sample(s) for s in samples])
    batch["frames"] = torch.stack([torch.from_numpy(np.stack([load_qwen_frame(frame.path, RESOLUTION, base.base)
                                                              for frame in index.window(s)])) for s in samples])
    if with_features:  # Qwen2.5-VL's frames are VGGT's
        vggt = batch["frames"] if base is QWEN2_5 else torch.stack([window_frames(index, s) for s in samples])
        batch["features"] = tiny_encoder().encode(vggt)
    return batch


def select(batch: dict[str, torch.Tensor], row: int) -> dict[str, torch.Tensor]:
    """Sample ``row`` of a collated batch as a batch of one, with its padding removed."""
    length = int(batch["attention_mask"][row].sum())
    out = {}
    for name, value in batch.items():
        if value.dim() >= 2 and name in ("input_ids", "attention_mask", "labels", "segment_ids", "mm_token_type_ids"):
            out[name] = value[row : row + 1, :length]
        else:
            out[name] = value[row : row + 1]
    return out
