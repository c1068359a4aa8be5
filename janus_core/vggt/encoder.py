"""The encoder stage: uint8 frame windows -> frozen-VGGT features of each window's reference frame.

Builds the aggregator a profile names (a local checkpoint, or a config with seeded random weights),
and turns stored uint8 frames into the feature the cache keeps per sample. The same code serves
precompute and the live checks, so cached and live features come from one computation.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

from janus_core.dtypes import TORCH_DTYPES, dtype_name
from janus_core.imaging import vggt_input
from janus_core.profile import CacheSettings, EncoderSettings
from janus_core.vggt import AggregatorConfig, VGGTAggregator, weights_fingerprint
from janus_core.vggt.attention import SDPA
from janus_core.vggt.checkpoint import load_aggregator_state_dict, resolve_config, resolve_weights_file
from janus_core.windows import DEFAULT_HISTORY, window_frames


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
    model = model.to(device)
    if settings.compile:
        model.fuse()
    return model


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


# A frame's key for finding repeated frames: every PROBE_STRIDE-th byte. Only a cheap first sort;
# frames with equal keys are compared whole, so deduplication is exact whatever the key.
PROBE_STRIDE = 4099


def distinct_frames(windows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The distinct frames [U, H, W, 3] of uint8 windows [B, S, H, W, 3] (first appearance order)
    and the index [B, S] of each window frame among them.

    Overlapping windows of an episode share most frames (and early windows repeat frame 0), so a
    batch of windows holds far fewer distinct frames than B * S.
    """
    b, s = windows.shape[:2]
    flat = windows.reshape(b * s, -1)
    # On the CPU numpy compares and gathers whole frames many times faster than torch (which
    # copies uint8 element by element): ~20 ms for 4 windows of 644² frames.
    rows = flat.numpy() if flat.device.type == "cpu" else flat
    same = np.array_equal if flat.device.type == "cpu" else torch.equal
    keys = flat[:, ::PROBE_STRIDE].cpu().numpy()
    firsts: list[int] = []  # row in flat of each distinct frame
    groups: dict[bytes, list[int]] = {}  # key -> distinct frames having it
    index: list[int] = []
    for row in range(b * s):
        same_key = groups.setdefault(keys[row].tobytes(), [])
        match = next((u for u in same_key if same(rows[firsts[u]], rows[row])), None)
        if match is None:
            match = len(firsts)
            same_key.append(match)
            firsts.append(row)
        index.append(match)
    distinct = torch.from_numpy(rows[firsts]) if isinstance(rows, np.ndarray) else rows[firsts]
    return distinct.view(len(firsts), *windows.shape[2:]), torch.tensor(index).view(b, s)


@dataclass
class WindowEncoder:
    """Turns uint8 windows [B, S, H, W, 3] into reference-frame features [B, N, 2C].

    With ``dedup`` (the default; off only to measure it) each distinct frame of a call is
    converted, moved to the device and patch-embedded once; the features are bit-identical.
    """

    model: VGGTAggregator
    reference_frame: str
    layer: int
    feature_dtype: torch.dtype
    dedup: bool = True

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
        if not self.dedup:
            images = vggt_input(windows.to(self.device, non_blocking=True).reshape(b * s, h, w, 3))
            features = self.model.window_features(
                images.view(b, s, 3, h, w), reference_frame=self.reference_frame, layer=self.layer
            )
            return features.to(self.feature_dtype)
        frames, index = distinct_frames(windows)
        images = vggt_input(frames.to(self.device, non_blocking=True))
        features = self.model.window_features(
            images, reference_frame=self.reference_frame, layer=self.layer, frame_index=index.to(self.device)
        )
        return features.to(self.feature_dtype)


# ---------------------------------------------------------------------- levers (for the benches)


@dataclass(frozen=True)
class EncoderLevers:
    """How the window runs: each speed lever on or off on its own (the benches measure each).

    ``kernel``: an attention kernel name (:mod:`janus_core.vggt.attention`), ``"sdpa"`` for
    PyTorch's default dispatch, None for the automatic choice.
    """

    dedup: bool = True
    kernel: str | None = None
    compile: bool = False

    def apply(self, encoder: WindowEncoder) -> WindowEncoder:
        encoder.model.use_attention_kernel(self.kernel)
        encoder.model.fuse(self.compile)
        return replace(encoder, dedup=self.dedup)


def lever_settings(kernels: Sequence[str]) -> dict[str, EncoderLevers]:
    """Today's path (no dedup, PyTorch's SDPA dispatch, eager), each lever alone, then all of them."""
    baseline = EncoderLevers(dedup=False, kernel=SDPA, compile=False)
    return {
        "baseline": baseline,
        "dedup": replace(baseline, dedup=True),
        **{f"kernel={name}": replace(baseline, kernel=name) for name in kernels if name != SDPA},
        "compile": replace(baseline, compile=True),
        "all": EncoderLevers(dedup=True, kernel=None, compile=True),
    }


def episode_windows(steps: Sequence[int], side: int, frames: int, history: int = DEFAULT_HISTORY,
                    seed: int = 0) -> torch.Tensor:
    """uint8 windows [len(steps), history + 1, side, side, 3] of the samples at ``steps`` of one
    random episode of ``frames`` frames: the frame sharing of real precompute batches."""
    generator = torch.Generator().manual_seed(seed)
    episode = torch.randint(0, 256, (frames, side, side, 3), dtype=torch.uint8, generator=generator)
    return torch.stack([episode[list(window_frames(step, history))] for step in steps])


# The benches' lever batches: B = 4 consecutive samples (the h800 profile's vggt_batch) of a
# 64-frame episode, starting at these steps (padded windows, then linspace ones): 4.25 distinct
# frames per window, as in a whole such episode at B = 4 (4.3). Two batches keep the bench short.
LEVER_BATCH = 4
LEVER_EPISODE_FRAMES = 64
LEVER_FIRST_STEPS = (12, 40)


def lever_batches(side: int, batch: int = LEVER_BATCH) -> list[torch.Tensor]:
    """The uint8 window batches the benches time each lever on (``batch`` consecutive samples each)."""
    return [episode_windows(range(step, step + batch), side, LEVER_EPISODE_FRAMES) for step in LEVER_FIRST_STEPS]
