"""The encoder stage: uint8 frame windows -> frozen-VGGT features of each window's reference frame.

Builds the aggregator a profile names (a local checkpoint, or a config with seeded random weights),
and turns stored uint8 frames into the feature the cache keeps per sample. The same code serves
precompute and the live checks, so cached and live features come from one computation.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from janus_cache.dtypes import TORCH_DTYPES, dtype_name
from janus_cache.imaging import vggt_input
from janus_cache.profile import CacheSettings, EncoderSettings
from janus_cache.vggt import AggregatorConfig, VGGTAggregator, weights_fingerprint
from janus_cache.vggt.checkpoint import load_aggregator_state_dict, resolve_config, resolve_weights_file


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
    return _fingerprint(weights_fingerprint(model), model.config)


def _fingerprint(weights: str, config: AggregatorConfig) -> str:
    architecture = {k: v for k, v in config.to_dict().items() if k != "attention"}
    digest = hashlib.sha256()
    digest.update(weights.encode())
    digest.update(json.dumps(architecture, sort_keys=True).encode())
    return digest.hexdigest()


class _AsLoaded(Mapping[str, torch.Tensor]):
    """A checkpoint's tensors as ``from_pretrained`` holds them (floating point as float32),
    converted one at a time while hashing, so no second full copy of the weights exists."""

    def __init__(self, state: Mapping[str, torch.Tensor]) -> None:
        self._state = state

    def __getitem__(self, key: str) -> torch.Tensor:
        tensor = self._state[key]
        return tensor.to(torch.float32) if tensor.is_floating_point() else tensor

    def __iter__(self) -> Iterator[str]:
        return iter(self._state)

    def __len__(self) -> int:
        return len(self._state)


@dataclass(frozen=True)
class EncoderIdentity:
    """What a cache keys about its encoder, known without running it: the fingerprint
    (:func:`encoder_fingerprint`) and the architecture (which fixes the feature shape)."""

    fingerprint: str
    config: AggregatorConfig

    def feature_shape(self, height: int, width: int) -> tuple[int, int]:
        return feature_shape(self.config, height, width)

    @classmethod
    def of(cls, model: VGGTAggregator) -> "EncoderIdentity":
        return cls(encoder_fingerprint(model), model.config)


def feature_shape(config: AggregatorConfig, height: int, width: int) -> tuple[int, int]:
    """``(N, 2C)`` of the feature of one ``height`` x ``width`` frame: N patches, two layers' C."""
    p = config.patch_size
    return ((height // p) * (width // p), 2 * config.embed_dim)


def checkpoint_identity(path: str | Path) -> EncoderIdentity:
    """The identity of the encoder ``load_aggregator`` would load from checkpoint ``path``,
    computed from the file without constructing the aggregator.

    Equal to :func:`encoder_fingerprint` of the loaded module for the same weights, whatever the
    file format (safetensors or torch) and stored float dtype: the module holds float32 copies of
    exactly the checkpoint's aggregator tensors (loading is strict), and that is what is hashed.
    """
    weights_file = resolve_weights_file(path)
    config = resolve_config(weights_file, None)
    state = load_aggregator_state_dict(weights_file)
    return EncoderIdentity(_fingerprint(weights_fingerprint(_AsLoaded(state)), config), config)


def encoder_identity(settings: EncoderSettings, attention: str) -> EncoderIdentity:
    """The identity of a profile's encoder: from its checkpoint file without building the model;
    a seeded random encoder (no checkpoint) is built on the CPU, as its weights exist nowhere else."""
    if settings.path is not None:
        return checkpoint_identity(settings.path)
    return EncoderIdentity.of(load_aggregator(settings, attention, "cpu"))


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
        return feature_shape(self.model.config, height, width)

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
