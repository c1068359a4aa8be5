"""The tiny golden aggregator's weights, regenerated from the rule in vggt_golden/config.json.

The goldens were produced with weights drawn by that rule, so the tests rebuild them instead of
shipping a 5.8 MB weights file; `test_golden_weights_follow_the_documented_rule` pins the rule.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

from janus_core.vggt import VGGTAggregator

GOLDEN_DIR = Path(__file__).resolve().parents[1] / "data" / "vggt_golden"
_TOKEN_KEYS = {"camera_token", "register_token", "cls_token", "mask_token", "pos_embed", "register_tokens"}


def golden_config() -> dict:
    return json.loads((GOLDEN_DIR / "config.json").read_text())["aggregator"]


@lru_cache(maxsize=1)
def _golden_state() -> dict[str, torch.Tensor]:
    shapes = {k: tuple(v.shape) for k, v in VGGTAggregator(**golden_config()).state_dict().items()}
    rng = np.random.default_rng(1234)
    state = {}
    for key, shape in shapes.items():  # one draw per key, in state_dict order
        z = rng.standard_normal(shape)
        leaf = key.rsplit(".", 1)[-1]
        if leaf == "gamma":
            value = np.full(shape, 0.1)
        elif "norm" in key and leaf == "weight":
            value = 1.0 + 0.1 * z
        elif leaf in _TOKEN_KEYS:
            value = z
        else:
            value = 0.02 * z
        state[key] = torch.from_numpy(value.astype(np.float32))
    return state


def golden_state() -> dict[str, torch.Tensor]:
    """Bare aggregator keys of the tiny golden model (fresh tensors: callers may modify them)."""
    return {k: v.clone() for k, v in _golden_state().items()}


def write_golden_weights(path: Path) -> Path:
    save_file(golden_state(), str(path))
    return path
