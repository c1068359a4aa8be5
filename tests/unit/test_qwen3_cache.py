"""A cache for a Qwen3-VL base (docs/bases.md, janus_cache/keys.py), built by the real precompute
job from real PNG files: it stores Qwen3-VL's own uint8 frames (the frame paired with VGGT's,
64x64 at pad56), its features come from VGGT's own frames of the same sources, the base and both
frame sizes are keyed, a cache of one base is refused for the other in one line, verify --live
compares Qwen3-VL's pixel values, VGGT features and fused embeddings (DeepStack inputs included),
and a cache written without a base key (every cache before Qwen3-VL) reads as Qwen2.5-VL's."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import AutoImageProcessor

from janus_cache.keys import window_variant
from janus_cache.work_units import encode_windows, window_matrix
from janus_cache.job import PrecomputeError, PrecomputeJob, precompute_base
from janus_cache.store import open_cache, open_writer, read_manifest
from janus_cache.store.features import to_stored
from janus_cache.store.manifest import Manifest, keyed_digest
from janus_cache.verify import CacheVerificationError, check_cache_for_training
from janus_cache.verify.live import check_live
from janus_core.bases import QWEN2_5_VL, QWEN3_VL
from janus_core.vggt.encoder import WindowEncoder
from janus_core.imaging import FrameError, load_frame, load_qwen_frame, qwen_pixel_values
from janus_core.index import DatasetIndex, build_index
from janus_core.profile import Profile, load_profile
from janus_core.sample_data import write_sample_data

# pad56: VGGT's 4x4 patches; Qwen3-VL's paired frame is 64x64 (4x4 patches of 16 px, 2x2 tokens).
SMALL = ("cache.resolution=pad56", "cache.frames_per_shard=4", "cache.samples_per_shard=3", "cache.history=3")
QWEN3_SIDE = 64


@pytest.fixture(scope="module")
def qwen3_profile() -> Profile:
    return load_profile("tiny-qwen3", SMALL)


@pytest.fixture(scope="module")
def qwen25_profile() -> Profile:
    return load_profile("tiny", SMALL)


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> DatasetIndex:
    data = write_sample_data(tmp_path_factory.mktemp("qwen3data") / "data", episodes=2, steps=4, seed=5)
    return build_index(data, history=3)


def precompute(index: DatasetIndex, out: Path, profile: Profile, cache_format: str = "zarr") -> PrecomputeJob:
    """The precompute job run to the end in this process, every shard in order."""
    encoder = WindowEncoder.from_settings(profile.vggt, profile.cache)
    job = PrecomputeJob(index, out, cache_format, profile.cache, profile.cache.resolution, encoder,
                        base=precompute_base(profile))
    job.prepare()
    for shard in range(job.n_frame_shards):
        assert job.frame_shard(shard) == {}
    job.prepare_features()
    job.feature_shards(list(range(job.n_feature_shards)))
    job.finish()
    return job


@pytest.fixture(scope="module")
def qwen3_cache(index: DatasetIndex, qwen3_profile: Profile, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return precompute(index, tmp_path_factory.mktemp("qwen3cache") / "cache", qwen3_profile).out


@pytest.fixture(scope="module")
def qwen25_cache(index: DatasetIndex, qwen25_profile: Profile, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return precompute(index, tmp_path_factory.mktemp("qwen25cache") / "cache", qwen25_profile).out


def test_the_manifest_keys_the_base_and_both_frame_sizes(qwen3_cache: Path, qwen3_profile: Profile) -> None:
    manifest = read_manifest(qwen3_cache)
    assert manifest is not None and manifest.base == "qwen3_vl"
    entry = manifest.resolutions["pad56"]
    assert entry.frame_shape == (QWEN3_SIDE, QWEN3_SIDE, 3)  # what is stored: Qwen3-VL's frame
    assert entry.preprocessing == {"mode": "pad", "target": 56, "resample": "PIL bicubic", "pad_value": 255,
                                   "frame_patch": 16, "frame_target": QWEN3_SIDE}  # VGGT's frame and the pairing
    encoder = WindowEncoder.from_settings(qwen3_profile.vggt, qwen3_profile.cache)
    assert entry.feature_shape == encoder.feature_shape(56, 56)  # features of VGGT's 56x56 frame: 4x4 patches
    # The base is part of the keyed fingerprint: the same manifest for the other base digests differently.
    assert keyed_digest(manifest) != keyed_digest(replace(manifest, base=QWEN2_5_VL.model_type))
    assert json.loads((qwen3_cache / "manifest.json").read_text())["base"] == "qwen3_vl"


def test_stored_frames_are_qwen3s_and_the_features_come_from_vggts_frames(
    qwen3_cache: Path, qwen3_profile: Profile, index: DatasetIndex,
) -> None:
    reader = open_cache(qwen3_cache, resolution="pad56", variant=window_variant(qwen3_profile.cache).name).reader
    assert len(reader) == len(index.samples)
    windows = window_matrix(index)
    vggt_windows = np.stack([np.stack([load_frame(index.frames[r].path, "pad56") for r in w]) for w in windows])
    encoder = WindowEncoder.from_settings(qwen3_profile.vggt, qwen3_profile.cache)
    per_shard = qwen3_profile.cache.samples_per_shard
    # As precompute batches them: shard by shard, vggt_batch windows per encoder call.
    features = torch.cat([encode_windows(encoder, vggt_windows[i:i + per_shard], qwen3_profile.cache.vggt_batch)
                          for i in range(0, len(vggt_windows), per_shard)])
    for row in range(len(reader)):
        sample = reader.sample(row)
        window = [index.frames[r].path for r in windows[row]]
        assert sample.frames.shape == (4, QWEN3_SIDE, QWEN3_SIDE, 3)
        assert np.array_equal(sample.frames, np.stack([load_qwen_frame(p, "pad56", QWEN3_VL) for p in window]))
        stored = to_stored(features[row], qwen3_profile.cache.feature_dtype)
        assert np.array_equal(to_stored(sample.feature, qwen3_profile.cache.feature_dtype), stored)


def test_pixel_values_of_the_stored_frames_equal_qwen3_vls_processor_on_the_same_pngs(
    qwen3_cache: Path, qwen3_profile: Profile, tmp_path: Path,
) -> None:
    """The stored uint8 frames, saved as PNG files, through the tiny Qwen3-VL's own image processor
    (no resize) and through janus's lookup table: bit for bit."""
    reader = open_cache(qwen3_cache, resolution="pad56", variant=window_variant(qwen3_profile.cache).name).reader
    stored = np.concatenate([reader.sample(row).frames for row in (0, len(reader) - 1)])
    paths = []
    for i, frame in enumerate(stored):
        paths.append(tmp_path / f"frame{i}.png")
        Image.fromarray(frame).save(paths[-1])
    processor = AutoImageProcessor.from_pretrained(qwen3_profile.qwen.path)
    no_resize = {"shortest_edge": QWEN3_SIDE * QWEN3_SIDE, "longest_edge": QWEN3_SIDE * QWEN3_SIDE}
    from_pngs = processor([Image.open(p) for p in paths], size=no_resize, return_tensors="pt")
    ours, grid = qwen_pixel_values(torch.from_numpy(stored), base=QWEN3_VL)
    assert grid.tolist() == [[1, 4, 4]] * len(stored)
    assert torch.equal(ours, from_pngs["pixel_values"]) and torch.equal(grid, from_pngs["image_grid_thw"])


@pytest.mark.parametrize("made_for", ["qwen3", "qwen2_5"])
def test_a_cache_of_one_base_is_refused_for_the_other_in_one_line(
    made_for: str, qwen3_cache: Path, qwen25_cache: Path, qwen3_profile: Profile, qwen25_profile: Profile,
    index: DatasetIndex,
) -> None:
    cache, other, base = ((qwen3_cache, qwen25_profile, "Qwen3-VL") if made_for == "qwen3"
                          else (qwen25_cache, qwen3_profile, "Qwen2.5-VL"))
    before = {p: p.read_bytes() for p in sorted(cache.rglob("*")) if p.is_file()}
    # precompute (a resume or an append into it) ...
    encoder = WindowEncoder.from_settings(other.vggt, other.cache)
    job = PrecomputeJob(index, cache, "zarr", other.cache, other.cache.resolution, encoder, base=precompute_base(other))
    with pytest.raises(PrecomputeError) as refused:
        job.prepare()
    line = str(refused.value)
    assert "\n" not in line and line.startswith(f"{cache} is a cache for {base}") and "--overwrite" in line
    # ... and training's start check, which verify's freshness makes.
    with pytest.raises(CacheVerificationError) as refused_training:
        check_cache_for_training(cache, other)
    line = str(refused_training.value)
    assert "\n" not in line and f"{cache} is a cache for {base}" in line, line
    assert f"qwen.path {other.qwen.path}" in line and "precompute a cache with this profile into another --out" in line
    assert {p: p.read_bytes() for p in sorted(cache.rglob("*")) if p.is_file()} == before


def test_a_cache_without_a_base_key_is_qwen25s_and_still_opens(
    qwen25_cache: Path, qwen25_profile: Profile,
) -> None:
    """A Qwen2.5-VL cache's manifest is written as before a second base existed (no base key, the
    same keyed digest), so every earlier cache opens and trains as it did."""
    text = (qwen25_cache / "manifest.json").read_text()
    assert '"base"' not in text
    manifest = Manifest.from_json(text)
    assert manifest.base == QWEN2_5_VL.model_type
    data = manifest.to_dict()
    assert "base" not in data and Manifest.from_dict(data) == manifest
    check_cache_for_training(qwen25_cache, qwen25_profile)  # passes: no exception
    opened = open_cache(qwen25_cache, resolution="pad56", variant=window_variant(qwen25_profile.cache).name)
    assert opened.reader.sample(0).frames.shape == (4, 56, 56, 3)


def test_verify_live_passes_on_a_qwen3_cache_and_fails_on_a_damaged_feature(
    qwen3_cache: Path, qwen3_profile: Profile, index: DatasetIndex, tmp_path: Path,
) -> None:
    from janus_train.model.janus_model import JanusVLNModel

    model = JanusVLNModel.from_profile(qwen3_profile, live=False, device="cpu").eval()
    calls: list[int] = []

    def embed(frames: torch.Tensor, features: torch.Tensor):  # noqa: ANN202 - the model's own return
        fused, deepstack = model.visual_embeddings(frames, features)
        calls.append(len(deepstack))  # the DeepStack inputs are compared with the fused embeddings
        return fused, deepstack

    rows = [0, 5]
    result = check_live(qwen3_cache, qwen3_profile, index, rows, device="cpu", embed=embed)
    assert result.passed, result.problems
    assert result.data["frames_identical"] and result.data["pixel_values_identical"]
    assert calls and all(n == len(model.qwen.config.vision_config.deepstack_visual_indexes) for n in calls)

    damaged = Path(shutil.copytree(qwen3_cache, tmp_path / "damaged"))
    variant = window_variant(qwen3_profile.cache).name
    reader = open_cache(damaged, resolution="pad56", variant=variant).reader
    shard_rows = range(qwen3_profile.cache.samples_per_shard)  # sample shard 0
    features = torch.stack([reader.sample(r).feature for r in shard_rows])
    features[0] += 0.5  # a wrong feature, written and committed like a right one
    open_writer("zarr", damaged, variant).write_samples_shard("pad56", 0, features)
    result = check_live(damaged, qwen3_profile, index, rows, device="cpu", embed=embed)
    assert not result.passed
    assert any(p.startswith(f"sample {reader.sample(0).key}: VGGT feature max abs error") for p in result.problems)


def test_a_source_that_vanishes_before_the_features_phase_is_one_line_naming_it(
    index: DatasetIndex, qwen3_profile: Profile, tmp_path: Path,
) -> None:
    """VGGT's frames of a Qwen3-VL cache are decoded again from the sources in the features phase:
    a file removed after its Qwen3-VL frame was stored stops the run with its name and the fix."""
    data = Path(shutil.copytree(index.source, tmp_path / "data"))
    copy = build_index(data, history=3)
    encoder = WindowEncoder.from_settings(qwen3_profile.vggt, qwen3_profile.cache)
    job = PrecomputeJob(copy, tmp_path / "cache", "zarr", qwen3_profile.cache, qwen3_profile.cache.resolution,
                        encoder, base=QWEN3_VL)
    job.prepare()
    for shard in range(job.n_frame_shards):
        job.frame_shard(shard)
    job.prepare_features()
    vanished = copy.frames[int(window_matrix(copy)[0][-1])].path
    vanished.unlink()
    with pytest.raises(FrameError) as stopped:
        job.feature_shards([0])
    line = str(stopped.value)
    assert "\n" not in line and line.startswith(f"{vanished} decoded when its Qwen3-VL frame was stored but not now")
    assert line.endswith("restore it, or rebuild the cache with --overwrite")
