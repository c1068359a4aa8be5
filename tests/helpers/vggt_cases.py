"""The tiny VGGT encoder and windows of one random episode, for the encoder's tests."""

from __future__ import annotations

import json
from collections.abc import Sequence

import torch

import janus_core.vggt.encoder as encoder_module
from helpers.profiles import REPO_ROOT
from janus_core.vggt import AggregatorConfig, VGGTAggregator

TINY_VGGT = REPO_ROOT / "configs" / "models" / "tiny-vggt.json"


SIDE = 56


CPU = torch.device("cpu")


def tiny_model() -> VGGTAggregator:
    torch.manual_seed(0)
    return VGGTAggregator.from_config(AggregatorConfig.from_dict(json.loads(TINY_VGGT.read_text())))


def episode_windows(steps: Sequence[int]) -> torch.Tensor:
    """uint8 windows [len(steps), 9, SIDE, SIDE, 3] of samples of one random 14-frame episode."""
    return encoder_module.episode_windows(steps, SIDE, 14)
