"""The encoder stage: uint8 frame windows -> frozen-VGGT features of each window's reference frame.

Builds the aggregator a profile names (a local checkpoint, or a config with seeded random weights),
and turns stored uint8 frames into the feature the cache keeps per sample. The same code serves
precompute and the live checks, so cached and live features come from one computation.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from janus_cache.dtypes import TORCH_DTYPES, dtype_name
from janus_cache.imaging import vggt_input
from janus_cache.profile import CacheSettings, EncoderSettings
from janus_cache.vggt import AggregatorConfig, VGGTAggregator, weights_fingerprint
from janus_cache.vggt.checkpoint import resolve_config, resolve_weights_file


def load_aggregator(settings: EncoderSettings, attention: str, device: str | torch.device = "cpu") -> VGGTAggregator:
    """The frozen aggregator of a profile, on ``device``, with the profile's attention mode.

    Random weights are drawn on the CPU from the profile's seed, so every process and every
    device gets the same numbers (and therefore the same weights fingerprint).
    """
    if settings.path is not None:
        config = resolve_config(resolve_weights_file(settings.path), None)
        model = VGGTAggregator.from_pretrained(settings.path, config=replace(config, attention=attention))
    else:
        assert settings.config is not None
        config = AggregatorConfig.from_dict(json.loads(Path(settings.config).read_text()))
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(settings.seed)
            model = VGGTAggregator.from_config(replace(config, attention=attention))
    return model.to(device)


def encoder_fingerprint(model: VGGTAggregator) -> str:
    """Hash of the weights and of the architecture settings that change the numbers but no shape.

    The attention mode is left out on purpose: it is part of the window variant, keyed separately.
    """
    architecture = {k: v for k, v in model.config.to_dict().items() if k != "attention"}
    digest = hashlib.sha256()
    digest.update(weights_fingerprint(model).encode())
    digest.update(json.dumps(architecture, sort_keys=True).encode())
    return digest.hexdigest()


@dataclass
class WindowEncoder:
    """Turns uint8 windows [B, S, H, W, 3] into reference-frame features [B, N, 2C]."""

    model: VGGTAggregator
    reference_frame: str
    layer: int
    feature_dtype: torch.dtype

    @classmethod
    def from_settings(
        cls, encoder: EncoderSettings, cache: CacheSettings, device: str | torch.device = "cpu"
    ) -> "WindowEncoder":
        model = load_aggregator(encoder, cache.attention, device)
        return cls(model, cache.reference_frame, cache.layer, TORCH_DTYPES[cache.feature_dtype])

    @property
    def feature_dtype_name(self) -> str:
        return dtype_name(self.feature_dtype)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def feature_shape(self, height: int, width: int) -> tuple[int, int]:
        p = self.model.config.patch_size
        return ((height // p) * (width // p), 2 * self.model.config.embed_dim)

    def encode(self, windows: torch.Tensor) -> torch.Tensor:
        """Features of each window's reference frame, in the cache's feature dtype, on the encoder's device."""
        if windows.dim() != 5 or windows.dtype != torch.uint8:
            raise ValueError(f"expected uint8 windows [B, S, H, W, 3], got {windows.dtype} {tuple(windows.shape)}")
        b, s, h, w, _ = windows.shape
        images = vggt_input(windows.to(self.device, non_blocking=True).reshape(b * s, h, w, 3))
        features = self.model.window_features(
            images.view(b, s, 3, h, w), reference_frame=self.reference_frame, layer=self.layer
        )
        return features.to(self.feature_dtype)
