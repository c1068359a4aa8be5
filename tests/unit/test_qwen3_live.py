"""Training live, and the periodic live feature check, on a Qwen3-VL base, in this process.

A Qwen3-VL cache stores Qwen3-VL's frames (64x64 at pad56) and features of VGGT's own frames of the
same sources (56x56). The live path makes both from the source PNGs as precompute does, so a live
sample equals the cached one (prompt, frames, pixel values; features within verify's tolerance),
and the live check recomputes a cached batch's features from VGGT's frames decoded from the dataset
(``--data``): it passes on the cache and names the sample whose cached feature is damaged.

The data: 2 episodes x 4 steps of sample data, precomputed by the real job into a tiny Qwen3-VL zarr
cache (history 3, 3 samples per shard)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from janus_cache.keys import window_variant
from janus_cache.job import PrecomputeJob, precompute_base
from janus_cache.store import open_cache, open_writer
from janus_cache.verify.comparison import feature_tolerance
from janus_core.bases import QWEN3_VL
from janus_core.vggt.encoder import WindowEncoder
from janus_core.imaging import qwen_pixel_values
from janus_core.index import build_index
from janus_core.profile import Profile, load_profile
from janus_core.sample_data import write_sample_data
from janus_train.data.live_check import compare_features, source_windows
from janus_train.data.sources import live_check_refusal
from janus_train.data.samples import CachedSamples, LiveFrames, LiveSamples, collate
from janus_train.build import prompt_builder
from janus_train.data.from_profile import make_dataset, open_training_cache
from janus_train.model.janus_model import JanusVLNModel, ModelInputError

SMALL = ("cache.resolution=pad56", "cache.frames_per_shard=4", "cache.samples_per_shard=3", "cache.history=3")
ROWS = [0, 5]  # one sample of each episode


@pytest.fixture(scope="module")
def profile() -> Profile:
    return load_profile("tiny-qwen3", SMALL)


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_sample_data(tmp_path_factory.mktemp("qwen3live") / "data", episodes=2, steps=4, seed=7)


@pytest.fixture(scope="module")
def cache(data: Path, profile: Profile, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real precompute job run to the end in this process."""
    index = build_index(data, history=profile.cache.history)
    job = PrecomputeJob(index, tmp_path_factory.mktemp("qwen3live") / "cache", "zarr", profile.cache,
                        profile.cache.resolution, WindowEncoder.from_settings(profile.vggt, profile.cache),
                        base=precompute_base(profile))
    job.prepare()
    for shard in range(job.n_frame_shards):
        assert job.frame_shard(shard) == {}
    job.prepare_features()
    job.feature_shards(list(range(job.n_feature_shards)))
    job.finish()
    return job.out


@pytest.fixture(scope="module")
def model(profile: Profile) -> JanusVLNModel:
    return JanusVLNModel.from_profile(profile, live=True, device="cpu").eval()


def cached_batch(profile: Profile, cache: Path, rows: list[int]) -> dict:
    samples = CachedSamples(open_training_cache(profile, cache).reader, prompt_builder(profile))
    return collate([samples[r] for r in rows], pad_token_id=prompt_builder(profile).pad_token_id)


def test_a_live_qwen3_sample_equals_its_cached_sample(profile: Profile, cache: Path, data: Path,
                                                      model: JanusVLNModel) -> None:
    """The same samples live and from the cache: the same keys and tokens, Qwen3-VL's frames and
    pixel values bit for bit, VGGT's frames beside them, the live VGGT features within verify's
    tolerance of the cached ones and the same loss."""
    builder = prompt_builder(profile)
    live_samples = LiveSamples(build_index(data, history=profile.cache.history), builder,
                               profile.cache.resolution, QWEN3_VL)
    live = collate([live_samples[r] for r in ROWS], pad_token_id=builder.pad_token_id)
    cached = cached_batch(profile, cache, ROWS)
    assert live["keys"] == cached["keys"]
    assert torch.equal(live["input_ids"], cached["input_ids"]) and torch.equal(live["labels"], cached["labels"])
    assert live["frames"].shape == (2, 4, 64, 64, 3) and torch.equal(live["frames"], cached["frames"])
    assert live["vggt_frames"].shape == (2, 4, 56, 56, 3) and "vggt_frames" not in cached
    frames = live["frames"].flatten(0, 1)
    assert torch.equal(qwen_pixel_values(frames, base=QWEN3_VL)[0],
                       qwen_pixel_values(cached["frames"].flatten(0, 1), base=QWEN3_VL)[0])

    with torch.no_grad():
        out_live, out_cached = model(live), model(cached)
    check = compare_features(live["keys"], out_live.features, cached["features"], feature_tolerance("cpu"),
                             profile.cache.feature_dtype)
    assert check.passed, check.problem(0)
    torch.testing.assert_close(out_live.loss_parts.segment_ce_sum, out_cached.loss_parts.segment_ce_sum,
                               rtol=1e-3, atol=1e-4)


def test_the_trainers_live_data_is_made_for_the_profiles_base(profile: Profile, data: Path) -> None:
    """``--live-data`` on a Qwen3-VL profile reads both frames of each window."""
    live = make_dataset(profile, prompt_builder(profile), None, data, rank=0, world=1)
    assert isinstance(live, LiveSamples) and live.frames == LiveFrames(profile.cache.resolution, QWEN3_VL)
    item = live[0]
    assert item.frames.shape == (4, 64, 64, 3) and item.vggt_frames is not None
    assert item.vggt_frames.shape == (4, 56, 56, 3)


def test_vggt_never_runs_on_qwen3s_frames(profile: Profile, cache: Path, model: JanusVLNModel) -> None:
    """A Qwen3-VL batch with neither cached features nor VGGT's frames is one line, not VGGT on
    Qwen3-VL's 64x64 frames."""
    batch = cached_batch(profile, cache, ROWS[:1])
    with pytest.raises(ModelInputError, match=r"^a live Qwen3-VL batch needs 'vggt_frames'"):
        model({**batch, "features": None})


def test_the_live_check_passes_on_a_qwen3_cache_and_names_a_damaged_sample(
    profile: Profile, cache: Path, data: Path, model: JanusVLNModel, tmp_path: Path,
) -> None:
    """The trainer's live check on a cached micro-batch: VGGT on VGGT's frames decoded from the
    dataset's sources gives the cached features (within tolerance); a wrong feature written into
    the cache and committed like a right one is named by its sample, in one line."""
    windows = source_windows(data, cache, profile.cache.history, LiveFrames(profile.cache.resolution, QWEN3_VL))

    def live_check(root: Path):  # noqa: ANN202 - the check of janus_train.data.live_check
        batch = cached_batch(profile, root, ROWS)
        with torch.no_grad():
            live = model({**batch, "features": None, "vggt_frames": windows(batch["keys"])})
        return batch["keys"], compare_features(batch["keys"], live.features, batch["features"],
                                               feature_tolerance("cpu"), profile.cache.feature_dtype)

    _, check = live_check(cache)
    assert check.passed and check.problem(5) is None

    damaged = Path(shutil.copytree(cache, tmp_path / "damaged"))
    variant = window_variant(profile.cache).name
    reader = open_cache(damaged, resolution="pad56", variant=variant).reader
    shard = ROWS[1] // profile.cache.samples_per_shard
    shard_rows = range(shard * profile.cache.samples_per_shard, (shard + 1) * profile.cache.samples_per_shard)
    features = torch.stack([reader.sample(r).feature for r in shard_rows])
    features[ROWS[1] - shard_rows.start] += 0.5
    open_writer("zarr", damaged, variant).write_samples_shard("pad56", shard, features)
    keys, check = live_check(damaged)
    assert not check.passed and check.sample == keys[1]
    line = check.problem(5)
    assert line is not None and "\n" not in line
    assert line.startswith(f"live check at step 5: the cached VGGT feature of sample {keys[1]} differs from VGGT's")


def test_only_a_qwen3_cache_live_check_without_its_dataset_is_refused(profile: Profile) -> None:
    """The refusal at start (pipelines.train_start, before any rank works; the Trainer checks the same):
    the live check of a Qwen3-VL cache needs --data and one cache; training live, a check given its
    dataset and Qwen2.5-VL's check (on the batch's own frames) start."""
    line = live_check_refusal(profile, 5, caches=1, data=None)
    assert line is not None and "\n" not in line
    assert line.startswith(f"{profile.source}: train.live_check_every on a Qwen3-VL cache decodes VGGT's frames")
    assert line.endswith("or set train.live_check_every: 0")
    assert live_check_refusal(profile, 5, caches=2, data="data") == line  # a mixture: --data names one dataset
    assert live_check_refusal(profile, 5, caches=1, data="data") is None
    assert live_check_refusal(profile, 5, caches=0, data=None) is None  # --live-data
    assert live_check_refusal(profile, 0, caches=1, data=None) is None  # no live check
    qwen25 = load_profile("tiny", SMALL)
    assert qwen25.qwen.path != profile.qwen.path
    assert live_check_refusal(qwen25, 5, caches=1, data=None) is None
