"""Small structured cache contents for the store tests, written through the real writers.

Frames are flat colour patches with a moving square (they compress like rendered frames,
unlike noise); windows come from the real window rule; features are random bf16/float32 values.
Everything is derived from a seed, so a spawned process rebuilds exactly the same content.
"""

from __future__ import annotations

import multiprocessing
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from janus_cache.store import (
    CacheSample,
    CacheWriter,
    DatasetIdentity,
    Manifest,
    ResolutionEntry,
    SampleMeta,
    ShardSizes,
    WindowVariant,
    open_writer,
    write_manifest,
)
from janus_core.dtypes import TORCH_DTYPES
from janus_core.windows import window_frames

VARIANT = WindowVariant(history=3, sampling="linspace", reference_frame="first", layer=-2, attention="causal")
RESOLUTION = "pad28"
FRAMES_PER_SHARD = 4
SAMPLES_PER_SHARD = 3


@dataclass(frozen=True)
class Content:
    """What a test cache holds; ``frames`` per resolution name."""

    frame_keys: list[str]
    frames: dict[str, np.ndarray]
    sample_keys: list[str]
    window_rows: np.ndarray
    actions: np.ndarray
    instructions: list[str]
    features: dict[str, torch.Tensor]
    feature_dtype: str

    @property
    def n_samples(self) -> int:
        return len(self.sample_keys)

    def sample_meta(self, row: int) -> SampleMeta:
        return SampleMeta(
            instruction=self.instructions[row],
            subinstruction=f"sub {row}",
            description_2d=f"a door on the left, row {row}",
            description_3d="",
            action=int(self.actions[row]),
            window_rows=tuple(self.window_rows[row].tolist()),
        )


def smooth_frames(n: int, height: int, width: int, seed: int) -> np.ndarray:
    """uint8 [n, H, W, 3]: flat 7x7-pixel colour patches (like walls and floors) and a moving square."""
    rng = np.random.default_rng(seed)
    frames = np.empty((n, height, width, 3), dtype=np.uint8)
    for i in range(n):
        coarse = rng.integers(0, 256, (height // 7 + 1, width // 7 + 1, 3), dtype=np.uint8)
        image = np.repeat(np.repeat(coarse, 7, axis=0), 7, axis=1)[:height, :width]
        top, left = (i * 3) % max(height - 6, 1), (i * 5) % max(width - 6, 1)
        image[top:top + 6, left:left + 6] = 255
        frames[i] = image
    return frames


def make_content(
    *,
    episodes: int = 2,
    steps: int = 7,
    history: int = VARIANT.history,
    resolutions: dict[str, tuple[int, int]] | None = None,
    feature_shape: tuple[int, int] = (4, 8),
    feature_dtype: str = "bfloat16",
    seed: int = 0,
) -> Content:
    """Episodes of ``steps`` frames; one sample per frame with the real window rule."""
    resolutions = resolutions or {RESOLUTION: (28, 28)}
    frame_keys = [f"ep{e:02d}/{i}" for e in range(episodes) for i in range(steps)]
    frames = {name: smooth_frames(len(frame_keys), h, w, seed + k) for k, (name, (h, w)) in enumerate(resolutions.items())}
    sample_keys, rows, actions, texts = [], [], [], []
    for e in range(episodes):
        for j in range(steps):
            sample_keys.append(f"ep{e:02d}/step.{j}")
            rows.append([e * steps + i for i in window_frames(j, history)])
            actions.append(j % 4)
            texts.append(f"walk to the {['red', 'blue'][e % 2]} door, step {j} — ü")
    generator = torch.Generator().manual_seed(seed)
    torch_dtype = TORCH_DTYPES[feature_dtype]
    features = {
        name: torch.randn(len(sample_keys), *feature_shape, generator=generator).to(torch_dtype)
        for name in resolutions
    }
    return Content(
        frame_keys=frame_keys,
        frames=frames,
        sample_keys=sample_keys,
        window_rows=np.asarray(rows, dtype=np.int32),
        actions=np.asarray(actions, dtype=np.int64),
        instructions=texts,
        features=features,
        feature_dtype=feature_dtype,
    )


def prepare(fmt: str, root: Path, content: Content, resolution: str = RESOLUTION, grow: bool = False) -> CacheWriter:
    """Single-process setup: tables, frames array and sample storage of ``resolution``; ``grow``:
    appending to a cache of the first rows of ``content`` (what precompute does for new episodes)."""
    writer = open_writer(fmt, root, VARIANT.name)
    writer.write_table("frames", {"key": content.frame_keys}, append=grow)
    writer.write_table(
        "samples",
        {
            "key": content.sample_keys,
            "window_rows": content.window_rows,
            "action": content.actions,
            "instruction": content.instructions,
            "subinstruction": [content.sample_meta(r).subinstruction for r in range(content.n_samples)],
            "description_2d": [content.sample_meta(r).description_2d for r in range(content.n_samples)],
            "description_3d": [content.sample_meta(r).description_3d for r in range(content.n_samples)],
        },
        append=grow,
    )
    frames = content.frames[resolution]
    writer.prepare_frames(resolution, frames.shape[1:3], FRAMES_PER_SHARD, grow=grow)
    feature = content.features[resolution]
    writer.prepare_samples(resolution, tuple(feature.shape[1:]), content.feature_dtype, SAMPLES_PER_SHARD, grow=grow)
    return writer


def episode_of(key: str) -> int:
    """The episode number of a frame or sample key of :func:`make_content` (``ep01/step.3`` -> 1)."""
    return int(key.split("/", 1)[0].removeprefix("ep"))


def first_episodes(content: Content, episodes: int) -> Content:
    """The first ``episodes`` episodes of ``content`` (its first frame and sample rows): the cache
    an append starts from."""
    n_frames = sum(1 for key in content.frame_keys if episode_of(key) < episodes)
    n_samples = sum(1 for key in content.sample_keys if episode_of(key) < episodes)
    return Content(
        frame_keys=content.frame_keys[:n_frames],
        frames={name: frames[:n_frames] for name, frames in content.frames.items()},
        sample_keys=content.sample_keys[:n_samples],
        window_rows=content.window_rows[:n_samples],
        actions=content.actions[:n_samples],
        instructions=content.instructions[:n_samples],
        features={name: features[:n_samples] for name, features in content.features.items()},
        feature_dtype=content.feature_dtype,
    )


def write_frame_shards(writer: CacheWriter, content: Content, resolution: str, shards: list[int]) -> None:
    plan = writer.frame_shard_plan(resolution)
    for i in shards:
        rows = plan[i]
        writer.write_frame_shard(resolution, i, content.frames[resolution][rows.start:rows.stop])


def write_sample_shards(writer: CacheWriter, content: Content, resolution: str, shards: list[int],
                        pass_windows: bool = True) -> None:
    plan = writer.sample_shard_plan(resolution)
    for i in shards:
        rows = plan[i]
        windows = content.frames[resolution][content.window_rows[rows.start:rows.stop]] if pass_windows else None
        writer.write_samples_shard(resolution, i, content.features[resolution][rows.start:rows.stop], windows)


def write_cache(fmt: str, root: Path, content: Content, resolution: str = RESOLUTION) -> CacheWriter:
    """A complete cache of ``content`` at ``resolution``."""
    writer = prepare(fmt, root, content, resolution)
    write_frame_shards(writer, content, resolution, list(range(len(writer.frame_shard_plan(resolution)))))
    write_sample_shards(writer, content, resolution, list(range(len(writer.sample_shard_plan(resolution)))))
    return writer


def write_cache_manifest(writer: CacheWriter, content: Content, resolutions: list[str]) -> Manifest:
    """Write the manifest of a cache whose ``resolutions`` are complete (what precompute's finish does)."""
    manifest = Manifest(
        format=writer.format,
        window=VARIANT,
        encoder_fingerprint="store-test-encoder",
        feature_dtype=content.feature_dtype,
        dataset=DatasetIdentity(digest="store-test", n_episodes=1, n_frames=len(content.frame_keys),
                                n_samples=content.n_samples),
        layout=ShardSizes(frames_per_shard=FRAMES_PER_SHARD, samples_per_shard=SAMPLES_PER_SHARD),
        resolutions={
            name: ResolutionEntry(name, {}, content.frames[name].shape[1:], tuple(content.features[name].shape[1:]))
            for name in resolutions
        },
        counts={"frames": len(content.frame_keys), "samples": content.n_samples},
        shards=writer.shard_table(),
    )
    write_manifest(writer.root, manifest)
    return manifest


def write_shards_in_process(fmt: str, root: str, seed: int, frame_shards: list[int], sample_shards: list[int]) -> None:
    """Entry point of a separate writer process: rebuild the content from ``seed``, write the shards."""
    content = make_content(seed=seed)
    writer = open_writer(fmt, root, VARIANT.name)
    write_frame_shards(writer, content, RESOLUTION, frame_shards)
    write_sample_shards(writer, content, RESOLUTION, sample_shards)


def write_with_two_processes(writer: CacheWriter, seed: int) -> None:
    """Write every shard of a prepared cache from two fresh interpreters (like torchrun's ranks),
    shards split round-robin, one writer per shard."""
    n_frames = len(writer.frame_shard_plan(RESOLUTION))
    n_samples = len(writer.sample_shard_plan(RESOLUTION))
    context = multiprocessing.get_context("spawn")
    processes = [
        context.Process(
            target=write_shards_in_process,
            args=(writer.format, str(writer.root), seed, list(range(rank, n_frames, 2)), list(range(rank, n_samples, 2))),
        )
        for rank in range(2)
    ]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=120)
        assert process.exitcode == 0


def bits(tensor: torch.Tensor) -> torch.Tensor:
    """The raw bits of a bf16 / float32 tensor, for bit-exact comparisons."""
    return tensor.view({torch.bfloat16: torch.int16, torch.float32: torch.int32}[tensor.dtype])


def assert_sample_equal(sample: CacheSample, content: Content, row: int, resolution: str = RESOLUTION) -> None:
    """``sample`` is exactly row ``row`` of ``content``: frames, feature bits, key and meta."""
    assert isinstance(sample, CacheSample)
    assert sample.key == content.sample_keys[row]
    assert sample.row == row
    frames = sample.frames
    assert isinstance(frames, np.ndarray) and frames.dtype == np.uint8
    assert np.array_equal(frames, content.frames[resolution][content.window_rows[row]])
    feature = sample.feature
    expected = content.features[resolution][row]
    assert isinstance(feature, torch.Tensor) and feature.dtype == expected.dtype
    assert torch.equal(bits(feature), bits(expected))
    assert sample.meta == content.sample_meta(row)
