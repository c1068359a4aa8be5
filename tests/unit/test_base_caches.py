"""A cache for each base (docs/bases.md, janus_cache/keys.py), built by the real precompute job
from real PNG files, and training and checking live on it, in this process.

A cache stores the base's own uint8 frames (Qwen3-VL's: the frame paired with VGGT's, 64x64 at
pad56) and features of VGGT's own frames of the same sources; the base and both frame sizes are
keyed, a cache of one base is refused for the other in one line, verify --live compares Qwen3-VL's
pixel values, VGGT features and fused embeddings (DeepStack inputs included), and a cache written
without a base key (every cache before Qwen3-VL) reads as Qwen2.5-VL's. With ``cache.vit_features``
a Qwen3-VL cache stores its ViT's levels (the last block and each DeepStack merger's input).

Live on Qwen3-VL, the samples equal the cached ones (prompt, frames, pixel values; features within
verify's tolerance), and the trainer's live check recomputes a cached batch's features from VGGT's
frames decoded from the dataset (``--data``): it passes on the cache and names the sample whose
cached feature is damaged.

The data: 2 episodes x 4 steps of sample data, precomputed into one zarr cache per base (history 3,
4 frames and 3 samples per shard), each built once for the module."""

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

from helpers.bases import QWEN2_5, QWEN3, BaseCase
from janus_cache.job import PrecomputeError, PrecomputeJob
from janus_cache.keys import window_variant
from janus_cache.store import open_cache, open_writer, read_manifest
from janus_cache.store.features import to_stored
from janus_cache.store.manifest import Manifest, keyed_digest
from janus_cache.verify import CacheVerificationError, check_cache_for_training
from janus_cache.verify.comparison import feature_tolerance
from janus_cache.verify.live import check_live
from janus_cache.work_units import encode_windows, window_matrix
from janus_core.bases import QWEN2_5_VL, QWEN3_VL, cache_base
from janus_core.imaging import FrameError, load_frame, load_qwen_frame, qwen_pixel_values
from janus_core.index import DatasetIndex, build_index
from janus_core.profile import Profile, load_profile
from janus_core.qwen_vit import ViTEncoder
from janus_core.sample_data import write_sample_data
from janus_core.vggt.encoder import WindowEncoder
from janus_train.build import prompt_builder
from janus_train.data.from_profile import make_dataset, open_training_cache
from janus_train.data.live_check import compare_features, source_windows
from janus_train.data.samples import CachedSamples, LiveFrames, LiveSamples, collate
from janus_train.data.sources import live_check_refusal
from janus_train.model.janus_model import JanusVLNModel, ModelInputError

# pad56: VGGT's 4x4 patches; Qwen3-VL's paired frame is 64x64 (4x4 patches of 16 px, 2x2 tokens).
SMALL = ("cache.resolution=pad56", "cache.frames_per_shard=4", "cache.samples_per_shard=3", "cache.history=3")
QWEN3_SIDE = 64


ROWS = [0, 5]  # one sample of each episode


@pytest.fixture(scope="module")
def qwen3_profile() -> Profile:
    return load_profile(QWEN3.profile, SMALL)


@pytest.fixture(scope="module")
def qwen25_profile() -> Profile:
    return load_profile(QWEN2_5.profile, SMALL)


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_sample_data(tmp_path_factory.mktemp("basedata") / "data", episodes=2, steps=4, seed=5)


@pytest.fixture(scope="module")
def index(data: Path) -> DatasetIndex:
    return build_index(data, history=3)


def precompute(index: DatasetIndex, out: Path, profile: Profile, cache_format: str = "zarr") -> PrecomputeJob:
    """The precompute job run to the end in this process, every shard in order."""
    encoder = WindowEncoder.from_settings(profile.vggt, profile.cache)
    job = PrecomputeJob(index, out, cache_format, profile.cache, profile.cache.resolution, encoder,
                        base=cache_base(profile.qwen.path))
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


@pytest.fixture(scope="module")
def base_cache(request: pytest.FixtureRequest, base: BaseCase) -> tuple[Path, Profile]:
    """The cache of the base (and its profile): the module's cache of that base."""
    name = "qwen3" if base is QWEN3 else "qwen25"
    return request.getfixturevalue(f"{name}_cache"), request.getfixturevalue(f"{name}_profile")


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


def test_stored_frames_are_the_bases_and_the_features_come_from_vggts_frames(
    base: BaseCase, base_cache: tuple[Path, Profile], index: DatasetIndex,
) -> None:
    cache, profile = base_cache
    side = base.base.frame_shape(56, 56)[0]
    reader = open_cache(cache, resolution="pad56", variant=window_variant(profile.cache).name).reader
    assert len(reader) == len(index.samples)
    windows = window_matrix(index)
    vggt_windows = np.stack([np.stack([load_frame(index.frames[r].path, "pad56") for r in w]) for w in windows])
    encoder = WindowEncoder.from_settings(profile.vggt, profile.cache)
    per_shard = profile.cache.samples_per_shard
    # As precompute batches them: shard by shard, vggt_batch windows per encoder call.
    features = torch.cat([encode_windows(encoder, vggt_windows[i:i + per_shard], profile.cache.vggt_batch)
                          for i in range(0, len(vggt_windows), per_shard)])
    assert side == (QWEN3_SIDE if base is QWEN3 else 56)
    for row in range(len(reader)):
        sample = reader.sample(row)
        window = [index.frames[r].path for r in windows[row]]
        assert sample.frames.shape == (4, side, side, 3)
        assert np.array_equal(sample.frames, np.stack([load_qwen_frame(p, "pad56", base.base) for p in window]))
        stored = to_stored(features[row], profile.cache.feature_dtype)
        assert np.array_equal(to_stored(sample.feature, profile.cache.feature_dtype), stored)


def test_pixel_values_of_the_stored_frames_equal_the_bases_processor_on_the_same_pngs(
    base: BaseCase, base_cache: tuple[Path, Profile], tmp_path: Path,
) -> None:
    """The stored uint8 frames, saved as PNG files, through the tiny base's own image processor
    (no resize) and through janus's lookup table: bit for bit."""
    cache, profile = base_cache
    side = base.base.frame_shape(56, 56)[0]
    reader = open_cache(cache, resolution="pad56", variant=window_variant(profile.cache).name).reader
    stored = np.concatenate([reader.sample(row).frames for row in (0, len(reader) - 1)])
    paths = []
    for i, frame in enumerate(stored):
        paths.append(tmp_path / f"frame{i}.png")
        Image.fromarray(frame).save(paths[-1])
    processor = AutoImageProcessor.from_pretrained(profile.qwen.path)
    no_resize = {"shortest_edge": side * side, "longest_edge": side * side}
    from_pngs = processor([Image.open(p) for p in paths], size=no_resize, return_tensors="pt")
    ours, grid = qwen_pixel_values(torch.from_numpy(stored), base=base.base)
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
    job = PrecomputeJob(index, cache, "zarr", other.cache, other.cache.resolution, encoder, base=cache_base(other.qwen.path))
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


# ------------------------------------------------------------------------------ live, on Qwen3-VL


@pytest.fixture(scope="module")
def live_model(qwen3_profile: Profile) -> JanusVLNModel:
    return JanusVLNModel.from_profile(qwen3_profile, live=True, device="cpu").eval()


def cached_batch(profile: Profile, cache: Path, rows: list[int]) -> dict:
    samples = CachedSamples(open_training_cache(profile, cache).reader, prompt_builder(profile))
    return collate([samples[r] for r in rows], pad_token_id=prompt_builder(profile).pad_token_id)


def test_a_live_qwen3_sample_equals_its_cached_sample(qwen3_profile: Profile, qwen3_cache: Path, data: Path,
                                                      live_model: JanusVLNModel) -> None:
    """The same samples live and from the cache: the same keys and tokens, Qwen3-VL's frames and
    pixel values bit for bit, VGGT's frames beside them, the live VGGT features within verify's
    tolerance of the cached ones and the same loss."""
    builder = prompt_builder(qwen3_profile)
    live_samples = LiveSamples(build_index(data, history=qwen3_profile.cache.history), builder,
                               qwen3_profile.cache.resolution, QWEN3_VL)
    live = collate([live_samples[r] for r in ROWS], pad_token_id=builder.pad_token_id)
    cached = cached_batch(qwen3_profile, qwen3_cache, ROWS)
    assert live["keys"] == cached["keys"]
    assert torch.equal(live["input_ids"], cached["input_ids"]) and torch.equal(live["labels"], cached["labels"])
    assert live["frames"].shape == (2, 4, 64, 64, 3) and torch.equal(live["frames"], cached["frames"])
    assert live["vggt_frames"].shape == (2, 4, 56, 56, 3) and "vggt_frames" not in cached
    frames = live["frames"].flatten(0, 1)
    assert torch.equal(qwen_pixel_values(frames, base=QWEN3_VL)[0],
                       qwen_pixel_values(cached["frames"].flatten(0, 1), base=QWEN3_VL)[0])

    with torch.no_grad():
        out_live, out_cached = live_model(live), live_model(cached)
    check = compare_features(live["keys"], out_live.features, cached["features"], feature_tolerance("cpu"),
                             qwen3_profile.cache.feature_dtype)
    assert check.passed, check.problem(0)
    torch.testing.assert_close(out_live.loss_parts.segment_ce_sum, out_cached.loss_parts.segment_ce_sum,
                               rtol=1e-3, atol=1e-4)


def test_the_trainers_live_data_is_made_for_the_profiles_base(qwen3_profile: Profile, data: Path) -> None:
    """``--live-data`` on a Qwen3-VL profile reads both frames of each window."""
    live = make_dataset(qwen3_profile, prompt_builder(qwen3_profile), None, data, rank=0, world=1)
    assert isinstance(live, LiveSamples) and live.frames == LiveFrames(qwen3_profile.cache.resolution, QWEN3_VL)
    item = live[0]
    assert item.frames.shape == (4, 64, 64, 3) and item.vggt_frames is not None
    assert item.vggt_frames.shape == (4, 56, 56, 3)


def test_vggt_never_runs_on_qwen3s_frames(qwen3_profile: Profile, qwen3_cache: Path,
                                          live_model: JanusVLNModel) -> None:
    """A Qwen3-VL batch with neither cached features nor VGGT's frames is one line, not VGGT on
    Qwen3-VL's 64x64 frames."""
    batch = cached_batch(qwen3_profile, qwen3_cache, ROWS[:1])
    with pytest.raises(ModelInputError, match=r"^a live Qwen3-VL batch needs 'vggt_frames'"):
        live_model({**batch, "features": None})


def test_the_live_check_passes_on_a_qwen3_cache_and_names_a_damaged_sample(
    qwen3_profile: Profile, qwen3_cache: Path, data: Path, live_model: JanusVLNModel, tmp_path: Path,
) -> None:
    """The trainer's live check on a cached micro-batch: VGGT on VGGT's frames decoded from the
    dataset's sources gives the cached features (within tolerance); a wrong feature written into
    the cache and committed like a right one is named by its sample, in one line."""
    windows = source_windows(data, qwen3_cache, qwen3_profile.cache.history,
                             LiveFrames(qwen3_profile.cache.resolution, QWEN3_VL))

    def live_check(root: Path):  # noqa: ANN202 - the check of janus_train.data.live_check
        batch = cached_batch(qwen3_profile, root, ROWS)
        with torch.no_grad():
            live = live_model({**batch, "features": None, "vggt_frames": windows(batch["keys"])})
        return batch["keys"], compare_features(batch["keys"], live.features, batch["features"],
                                               feature_tolerance("cpu"), qwen3_profile.cache.feature_dtype)

    _, check = live_check(qwen3_cache)
    assert check.passed and check.problem(5) is None

    damaged = Path(shutil.copytree(qwen3_cache, tmp_path / "damaged"))
    variant = window_variant(qwen3_profile.cache).name
    reader = open_cache(damaged, resolution="pad56", variant=variant).reader
    shard = ROWS[1] // qwen3_profile.cache.samples_per_shard
    shard_rows = range(shard * qwen3_profile.cache.samples_per_shard, (shard + 1) * qwen3_profile.cache.samples_per_shard)
    features = torch.stack([reader.sample(r).feature for r in shard_rows])
    features[ROWS[1] - shard_rows.start] += 0.5
    open_writer("zarr", damaged, variant).write_samples_shard("pad56", shard, features)
    keys, check = live_check(damaged)
    assert not check.passed and check.sample == keys[1]
    line = check.problem(5)
    assert line is not None and "\n" not in line
    assert line.startswith(f"live check at step 5: the cached VGGT feature of sample {keys[1]} differs from VGGT's")


def test_only_a_qwen3_cache_live_check_without_its_dataset_is_refused(qwen3_profile: Profile) -> None:
    """The refusal at start (pipelines.train_start, before any rank works; the Trainer checks the same):
    the live check of a Qwen3-VL cache needs --data and one cache; training live, a check given its
    dataset and Qwen2.5-VL's check (on the batch's own frames) start."""
    line = live_check_refusal(qwen3_profile, 5, caches=1, data=None)
    assert line is not None and "\n" not in line
    assert line.startswith(
        f"{qwen3_profile.source}: train.live_check_every on a Qwen3-VL cache decodes VGGT's frames")
    assert line.endswith("or set train.live_check_every: 0")
    assert live_check_refusal(qwen3_profile, 5, caches=2, data="data") == line  # a mixture: --data names one dataset
    assert live_check_refusal(qwen3_profile, 5, caches=1, data="data") is None
    assert live_check_refusal(qwen3_profile, 5, caches=0, data=None) is None  # --live-data
    assert live_check_refusal(qwen3_profile, 0, caches=1, data=None) is None  # no live check
    qwen25 = load_profile("tiny", SMALL)
    assert qwen25.qwen.path != qwen3_profile.qwen.path
    assert live_check_refusal(qwen25, 5, caches=1, data=None) is None



# ------------------------------------------------------------------ the ViT cache, on Qwen3-VL

LEVELS, PATCHES, VIT_DIM = 3, 16, 32  # the last block and 2 DeepStack layers; a 64x64 frame's 4x4 patches; ViT width


@pytest.fixture(scope="module")
def vit_profile() -> Profile:
    return load_profile(QWEN3.profile, (*SMALL, "cache.vit_features=true"))


@pytest.mark.parametrize("cache_format", ["zarr", "wds"])
def test_precompute_stores_qwen3_vit_levels_keyed_and_the_reader_gives_each_sample_its_windows(
    vit_profile: Profile, index: DatasetIndex, cache_format: str, tmp_path: Path,
) -> None:
    vit = ViTEncoder.from_profile(vit_profile)
    assert vit.base is QWEN3_VL and vit.feature_shape(64, 64) == (LEVELS, PATCHES, VIT_DIM)
    job = PrecomputeJob(index, tmp_path / "cache", cache_format, vit_profile.cache, vit_profile.cache.resolution,
                        WindowEncoder.from_settings(vit_profile.vggt, vit_profile.cache), vit, base=cache_base(vit_profile.qwen.path))
    job.prepare()
    for shard in range(job.n_frame_shards):
        assert job.frame_shard(shard) == {}
    for shard in range(job.n_vit_shards):
        job.vit_shard(shard)
    job.prepare_features()
    job.feature_shards(list(range(job.n_feature_shards)))
    job.finish()

    entry = read_manifest(job.out).vit_features["pad56"]
    assert entry.feature_shape == (LEVELS, PATCHES, VIT_DIM) and entry.fingerprint == vit.fingerprint
    reader = open_cache(job.out, resolution="pad56", variant=window_variant(vit_profile.cache).name,
                        vit_features=True).reader
    samples = list(reader) if cache_format == "wds" else [reader[row] for row in range(len(reader))]
    assert len(samples) == len(index.samples)
    for sample in samples[:3]:
        frames = torch.from_numpy(np.asarray(sample.frames))
        assert frames.shape == (4, 64, 64, 3)
        assert torch.equal(sample.vit_features, vit.encode(frames))  # [S, levels, tokens, D]

    check_cache_for_training(job.out, vit_profile)  # fresh for the vit_profile that made it: no exception
    live = check_live(job.out, vit_profile, index, [0, len(index.samples) - 1], device="cpu", vit=vit)
    assert live.passed, live.problems
    assert len(live.data["samples"]) == 2 and live.data["vit_features"]["max_abs"] == 0.0
