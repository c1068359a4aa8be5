"""The live check: for chosen samples, recompute from the source images with a profile's live
path and compare with the cache: uint8 frames and the base's ``pixel_values`` bit-identical, VGGT
features, fused image embeddings (with a DeepStack base, Qwen3-VL, its DeepStack inputs too) and
(a cache with ``vit_features``) the frozen ViT's output of the window's frames within the
tolerances of :mod:`janus_cache.verify.comparison`. The live frames are the base's own (for
Qwen3-VL, :func:`~janus_core.imaging.load_qwen_frame`) and the live features come from VGGT's
frames of the same sources (:mod:`janus_cache.keys`).

The fused embeddings come from a model this package does not know: the caller passes the
embedding function (``pipelines/verify.py`` builds the JanusVLN model), or none, and the
embeddings part is then reported as not run. The work splits over processes: each process runs a
:class:`LiveChecker` on its share of :func:`choose_live_rows`; :func:`live_result` joins them.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from janus_cache.keys import window_variant
from janus_cache.store import StoreError
from janus_cache.store.layout import SAMPLES_TABLE
from janus_cache.store.open import OpenedCache
from janus_cache.store.wds_store import decode_key, decode_sample
from janus_cache.store.zarr_group import ZarrGroup
from janus_cache.verify.cache import open_for_checks, wds_reader, zarr_reader
from janus_cache.verify.comparison import (
    EMBEDDING_TOLERANCES,
    STORAGE_ULP,
    VIT_TOLERANCES,
    Comparison,
    compare,
    encoder_compute_dtype,
    feature_tolerance,
)
from janus_cache.verify.freshness import as_profile, base_problem
from janus_cache.verify.results import DEFAULT_SEED, LIVE, CheckResult, guarded, listed, result, skipped, timer
from janus_core.bases import BASES, VGGT_PATCH_SIZE, cache_base
from janus_core.imaging import FrameError, load_frame, load_qwen_frame, qwen_pixel_values
from janus_core.index import DatasetIndex
from janus_core.plural import plural
from janus_core.profile import Profile
from janus_core.qwen_vit import ViTEncoder
from janus_core.system.device import process_device
from janus_core.vggt.encoder import WindowEncoder

DEFAULT_LIVE_SAMPLES = 4

Embedded = torch.Tensor | tuple[torch.Tensor, Sequence[torch.Tensor] | None]
ImageEmbeddings = Callable[[torch.Tensor, torch.Tensor], Embedded]
"""``embed(frames, features)``: the fused image embeddings of uint8 windows ``[B, S, H, W, 3]``
and their VGGT features ``[B, N, 2C]`` (e.g. ``JanusVLNModel.image_embeddings``), or those and a
DeepStack base's per-layer DeepStack embeddings (``JanusVLNModel.visual_embeddings``)."""

NOT_ASKED = "not asked for"
"""The embeddings note when no embedding function is given."""


@dataclass(frozen=True)
class LiveSample:
    """The live comparison of one sample (picklable: gathered from every process)."""

    key: str
    row: int
    problem: str | None = None
    frames_identical: bool = False
    differing_frame_bytes: int = 0
    differing_sources: tuple[str, ...] = ()
    pixel_values_identical: bool = False
    feature: Comparison | None = None
    embeddings: Comparison | None = None
    vit: Comparison | None = None
    """Cached vs live frozen-ViT output of the window's frames (caches with ViT features)."""


def choose_live_rows(root: Path | str, n: int, seed: int = DEFAULT_SEED) -> list[int]:
    """``n`` sample rows of the cache (all when it has fewer), chosen with ``seed``, sorted."""
    total = ZarrGroup(Path(root), read_only=True).table_rows(SAMPLES_TABLE)
    return sorted(random.Random(seed).sample(range(total), min(n, total)))


def read_cached_samples(cache: OpenedCache, resolution: str, rows: Sequence[int],
                        variant: str | None = None) -> dict[int, dict[str, Any] | str]:
    """Row -> the cache's sample dict (frames, feature, key) or the reason it cannot be read,
    through the store's reader of the cache's format."""
    try:
        if cache.format == "zarr":
            return _zarr_samples(cache, resolution, rows, variant)
        return _wds_samples(cache, resolution, rows, variant)
    except Exception as err:  # noqa: BLE001 - a damaged layout or table is a finding for every sample
        return {row: f"cannot read the cached sample: {type(err).__name__}: {err}" for row in rows}


def _zarr_samples(cache: OpenedCache, resolution: str, rows: Sequence[int],
                  variant: str | None) -> dict[int, dict[str, Any] | str]:
    reader = zarr_reader(cache, resolution, variant)
    out: dict[int, dict[str, Any] | str] = {}
    for row in rows:
        try:
            out[row] = reader.sample(row)
        except Exception as err:  # noqa: BLE001 - a corrupt shard is a finding for this sample
            out[row] = f"cannot read the cached sample: {type(err).__name__}: {err}"
    return out


def _wds_samples(cache: OpenedCache, resolution: str, rows: Sequence[int],
                 variant: str | None) -> dict[int, dict[str, Any] | str]:
    """Each row's sample decoded from the tar shard its row belongs to, as the stream decodes it."""
    reader = wds_reader(cache, resolution, variant)
    keys = cache.keys(SAMPLES_TABLE)
    plan = reader.layout.plan()
    per_shard: dict[int, list[int]] = {}
    for row in rows:
        per_shard.setdefault(next(i for i, r in enumerate(plan) if row in r), []).append(row)
    out: dict[int, dict[str, Any] | str] = {}
    for shard, shard_rows in per_shard.items():
        wanted = {keys[row]: row for row in shard_rows}
        try:
            for raw in reader.raw_samples(shard):
                row = wanted.get(decode_key(raw["__key__"]))
                if row is None:
                    continue
                sample = decode_sample(raw)
                if (sample.key, sample.row) != (keys[row], row):
                    raise StoreError(f"{raw['__url__']}: member {raw['__key__']} says key {sample.key!r} row "
                                     f"{sample.row}, the samples table has {keys[row]!r} at row {row}")
                out[row] = sample
        except Exception as err:  # noqa: BLE001 - unreadable tar content is a finding for its samples
            for row in shard_rows:
                out.setdefault(row, f"cannot read the cached sample from tar shard {shard} of {reader.array}: "
                                    f"{type(err).__name__}: {err}")
        for row in shard_rows:
            out.setdefault(row, f"not in tar shard {shard} of {reader.array}")
    return out


class LiveChecker:
    """Recomputes cached samples with a profile's live path and compares (one process's part).

    The live path: the sample's window from the dataset ``index``, each source image decoded with
    :func:`load_frame` at the profile's resolution, ``pixel_values`` from those frames, the
    profile's encoder on them, and (with ``embed``) the fused embeddings.
    """

    def __init__(self, root: Path | str, profile: Profile, index: DatasetIndex, device: torch.device | str,
                 encoder: WindowEncoder | None = None, embed: ImageEmbeddings | None = None,
                 embed_note: str = "", vit: ViTEncoder | None = None) -> None:
        self.cache = open_for_checks(root)
        self.profile = profile
        self.index = index
        self.device = torch.device(device)
        self.resolution = profile.cache.resolution
        self.variant = window_variant(profile.cache).name
        # The live frames are the cache's base's (a profile of another base is refused: unavailable()).
        self.base = BASES[self.cache.manifest.base]
        self.encoder = encoder or WindowEncoder.from_settings(profile.vggt, profile.cache, self.device)
        self.embed, self.embed_note = embed, embed_note
        self.feature_tolerance = feature_tolerance(self.device)
        self.embedding_tolerance = EMBEDDING_TOLERANCES[(self.device.type, profile.compute_dtype)]
        # A cache holding the frozen ViT's output at this resolution is compared with the live ViT.
        self.vit_entry = self.cache.manifest.vit_features.get(self.resolution.name)
        self.vit = None
        if self.vit_entry is not None:
            self.vit = vit or ViTEncoder.from_profile(profile, self.device)
            self.vit_tolerance = VIT_TOLERANCES[(self.device.type, profile.compute_dtype)]

    def unavailable(self) -> str | None:
        """Why the profile's samples cannot be read from this cache at all (None if they can)."""
        m = self.cache.manifest
        wanted = cache_base(self.profile.qwen.path)
        if wanted is not self.base:
            return base_problem(self.cache.root, self.profile, self.base, wanted)
        if self.resolution.name not in m.resolutions:
            return (f"the cache holds no frames at the profile's resolution {self.resolution.name} "
                    f"(it holds {', '.join(m.resolutions)})")
        if self.variant != m.window.name:
            return f"the cache holds window variant {m.window.name}, the profile's live path is {self.variant}"
        return None

    def measure(self, rows: Sequence[int], on_progress: Callable[[int], None] | None = None) -> list[LiveSample]:
        n_samples = self.cache.group.table_rows(SAMPLES_TABLE)
        outside = [r for r in rows if not 0 <= r < n_samples]
        if outside:
            raise ValueError(f"sample rows {outside} are out of range for the {n_samples} samples of {self.cache.root}")
        cached = read_cached_samples(self.cache, self.resolution.name, rows, self.variant)
        results: dict[int, LiveSample] = {}
        windows: dict[int, tuple[tuple[np.ndarray, np.ndarray], dict[str, Any]]] = {}
        for row in rows:
            got = cached[row]
            if isinstance(got, str):
                key = self.cache.name_of(SAMPLES_TABLE, row)
                results[row] = LiveSample(key, row, problem=f"sample {key}: {got}")
            else:
                measured = self._frames(row, got)
                if isinstance(measured, LiveSample):
                    results[row] = measured
                else:
                    windows[row] = (measured, got)
        # Live features in batches of the profile's encoder batch size, like the precompute.
        batch = self.profile.cache.vggt_batch
        ready = list(windows)
        done = len(results)
        for start in range(0, len(ready), batch):
            chunk = ready[start:start + batch]
            vggt_frames = np.stack([windows[r][0][1] for r in chunk])
            features = self.encoder.encode(torch.from_numpy(vggt_frames))
            for row, feature in zip(chunk, features):
                results[row] = self._compare(row, windows[row][0][0], windows[row][1], feature)
                done += 1
                if on_progress is not None:
                    on_progress(done)
        return [results[r] for r in rows]

    def _frames(self, row: int, cached: dict[str, Any]) -> tuple[np.ndarray, np.ndarray] | LiveSample:
        """The live window: the base's frames (what the cache stores) and VGGT's frames (what the
        features come from; the same array for a base with VGGT's patches)."""
        key = cached.key
        try:
            sample = self.index.sample(key)
        except KeyError:
            return LiveSample(key, row, problem=f"sample {key} is not in the dataset index of {self.index.source}")
        window = self.index.window(sample)
        try:
            vggt = np.stack([load_frame(f.path, self.resolution) for f in window])
            live = vggt if self.base.patch_size == VGGT_PATCH_SIZE else \
                np.stack([load_qwen_frame(f.path, self.resolution, self.base) for f in window])
        except FrameError as err:
            return LiveSample(key, row, problem=f"sample {key}: {err}")
        stored = np.asarray(cached.frames)
        if live.shape != stored.shape:
            return LiveSample(key, row, problem=f"sample {key}: live window frames are {live.shape}, "
                                                f"cached {stored.shape}")
        return live, vggt

    def _compare(self, row: int, live_frames: np.ndarray, cached: dict[str, Any],
                 live_feature: torch.Tensor) -> LiveSample:
        key = cached.key
        stored = np.asarray(cached.frames)
        differing = live_frames != stored
        sources = tuple(f.relpath for f, bad in zip(self.index.window(self.index.sample(key)),
                                                    differing.reshape(len(stored), -1).any(axis=1)) if bad)
        pixels_live, _ = qwen_pixel_values(live_frames, base=self.base)
        pixels_cached, _ = qwen_pixel_values(stored, base=self.base)
        pixels_identical = bool(torch.equal(pixels_live, pixels_cached))
        cached_feature = cached.feature
        if tuple(cached_feature.shape) != tuple(live_feature.shape):
            return LiveSample(key, row, problem=f"sample {key}: live feature {tuple(live_feature.shape)}, "
                                                f"cached {tuple(cached_feature.shape)}")
        feature = compare(live_feature, cached_feature, self.feature_tolerance, self.profile.cache.feature_dtype)
        vit = None
        if self.vit is not None:
            live_vit = self.vit.encode(torch.as_tensor(live_frames))
            cached_vit = self.cache.group.vit_features(self.resolution.name, cached.meta.window_rows)
            if tuple(cached_vit.shape) != tuple(live_vit.shape):
                return LiveSample(key, row, problem=f"sample {key}: live ViT features {tuple(live_vit.shape)}, "
                                                    f"cached {tuple(cached_vit.shape)}")
            vit = compare(live_vit, cached_vit, self.vit_tolerance, self.vit_entry.dtype)
        embeddings = None
        if self.embed is not None:
            with torch.no_grad():
                live_embeds = _embedded(self.embed(torch.as_tensor(live_frames)[None], live_feature[None]))
                cached_embeds = _embedded(self.embed(torch.as_tensor(stored)[None], cached_feature[None]))
            embeddings = compare(live_embeds, cached_embeds, self.embedding_tolerance, self.profile.cache.feature_dtype)
        return LiveSample(
            key, row,
            frames_identical=not differing.any(),
            differing_frame_bytes=int(differing.sum()),
            differing_sources=tuple(dict.fromkeys(sources)),
            pixel_values_identical=pixels_identical,
            feature=feature,
            embeddings=embeddings,
            vit=vit,
        )


def _embedded(out: Embedded) -> torch.Tensor:
    """One sample's embeddings as rows [n, hidden]: the fused image embeddings, then (a DeepStack
    base) each DeepStack layer's input, so one comparison covers everything the LLM is given."""
    main, deepstack = out if isinstance(out, tuple) else (out, None)
    width = main.shape[-1]
    return torch.cat([main.reshape(-1, width), *(layer.reshape(-1, width) for layer in deepstack or ())])


def live_result(samples: Sequence[LiveSample], profile: Profile, device: torch.device | str, seed: int,
                seconds: float, embed_note: str = "", unavailable: str | None = None) -> CheckResult:
    """One result from the live comparisons of every process."""
    device = torch.device(device)
    feature_tol = feature_tolerance(device)
    embed_tol = EMBEDDING_TOLERANCES[(device.type, profile.compute_dtype)]
    compute = f"encoder {device.type} {encoder_compute_dtype(device)}, model {device.type} {profile.compute_dtype}"
    if unavailable is not None:
        return result(LIVE, [unavailable], "cannot compare", seconds, compute=compute, samples=[])
    problems: list[str] = []
    for s in samples:
        if s.problem is not None:
            problems.append(s.problem)
            continue
        if not s.frames_identical:
            problems.append(f"sample {s.key}: cached uint8 frames differ from the live ones in "
                            f"{s.differing_frame_bytes} bytes (source files {listed(list(s.differing_sources))})")
        if not s.pixel_values_identical:
            problems.append(f"sample {s.key}: cached pixel_values differ from the live ones")
        for what, c in (("VGGT feature", s.feature), ("fused embeddings", s.embeddings), ("ViT features", s.vit)):
            if c is not None and not c.ok:
                problems.append(f"sample {s.key}: {what} max abs error {c.max_abs:.3g} (bound {c.bound:.3g}), "
                                f"cosine {c.cosine:.6f} (min {c.min_cosine})")
    compared = [s for s in samples if s.problem is None]
    feature = _summary([s.feature for s in compared if s.feature is not None])
    embeddings = _summary([s.embeddings for s in compared if s.embeddings is not None])
    vit = _summary([s.vit for s in compared if s.vit is not None])
    detail = f"{len(compared)}/{plural(len(samples), 'sample')} (seed {seed}) compared"
    if compared:
        same = all(s.frames_identical and s.pixel_values_identical for s in compared)
        detail += "; frames and pixel_values " + ("bit-identical" if same else "DIFFER")
        if feature:
            detail += (f"; features max abs {feature['max_abs']:.3g} (bound {feature['min_bound']:.3g}), mean abs "
                       f"{feature['mean_abs']:.3g}, min cosine {feature['min_cosine']:.6f}")
        if embeddings:
            detail += f"; embeddings max abs {embeddings['max_abs']:.3g} (bound {embeddings['min_bound']:.3g})"
        if vit:
            detail += f"; ViT features max abs {vit['max_abs']:.3g} (bound {vit['min_bound']:.3g})"
    if embed_note:
        detail += f"; embeddings not checked: {embed_note}"
    if not samples:
        detail = "no samples to compare"
    return result(
        LIVE, problems, detail, seconds, seed=seed, compute=compute,
        tolerances={"feature": asdict(feature_tol), "embeddings": asdict(embed_tol),
                    "vit": asdict(VIT_TOLERANCES[(device.type, profile.compute_dtype)]),
                    "storage_ulp": STORAGE_ULP[profile.cache.feature_dtype]},
        frames_identical=all(s.frames_identical for s in compared) if compared else None,
        pixel_values_identical=all(s.pixel_values_identical for s in compared) if compared else None,
        feature=feature, embeddings=embeddings, embeddings_note=embed_note, vit_features=vit,
        samples=[_sample_dict(s) for s in samples],
    )


def _summary(comparisons: Sequence[Comparison]) -> dict[str, float] | None:
    if not comparisons:
        return None
    return {
        "max_abs": max(c.max_abs for c in comparisons),
        "mean_abs": sum(c.sum_abs for c in comparisons) / max(sum(c.count for c in comparisons), 1),
        "min_cosine": min(c.cosine for c in comparisons),
        "max_scale": max(c.scale for c in comparisons),
        "min_bound": min(c.bound for c in comparisons),
    }


def _sample_dict(s: LiveSample) -> dict[str, Any]:
    def comparison(c: Comparison | None) -> dict[str, float] | None:
        return None if c is None else {"max_abs": c.max_abs, "mean_abs": c.mean_abs, "cosine": c.cosine,
                                       "scale": c.scale, "bound": c.bound}

    return {"key": s.key, "row": s.row, "problem": s.problem, "frames_identical": s.frames_identical,
            "pixel_values_identical": s.pixel_values_identical, "differing_sources": list(s.differing_sources),
            "feature": comparison(s.feature), "embeddings": comparison(s.embeddings), "vit": comparison(s.vit)}


@guarded(LIVE)
def check_live(root: Path | str, profile: Profile | str | Path, index: DatasetIndex | None, rows: Sequence[int],
               seed: int = DEFAULT_SEED, device: torch.device | str | None = None,
               encoder: WindowEncoder | None = None, embed: ImageEmbeddings | None = None,
               embed_note: str | None = None, vit: ViTEncoder | None = None) -> CheckResult:
    """The live check of sample ``rows`` (e.g. :func:`choose_live_rows` with ``seed``) in this
    process, against the sources of ``index`` (built with the profile's window history).

    Fused embeddings are compared with ``embed`` when given; ``embed_note`` says why they are not
    (default: "not asked for")."""
    if index is None:
        return skipped(LIVE, "not run: needs --data (the live path decodes the dataset's source images)")
    with timer() as elapsed:
        profile = as_profile(profile)
        device = torch.device(device) if device is not None else process_device(profile.device)
        note = embed_note if embed_note is not None else ("" if embed is not None else NOT_ASKED)
        checker = LiveChecker(root, profile, index, device, encoder, embed, note, vit)
        unavailable = checker.unavailable()
        samples = [] if unavailable else checker.measure(rows)
        return live_result(samples, profile, device, seed, elapsed(), note, unavailable)
