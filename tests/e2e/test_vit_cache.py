"""The frozen Qwen ViT's output cached per frame (``cache.vit_features``): the cache side.

Real ``janus-cache precompute`` / ``verify`` commands (their CLI run in this process) on real PNG
datasets, both formats: precompute stores ``vit/<resolution>`` once per frame, keyed in the manifest
by the ViT's fingerprint, base model and resolution; the reader gives every sample its window's
rows, equal to the ViT run on the stored frames; ``verify --live`` compares them with the live ViT,
a flipped byte in a ViT shard is named by verify; an append and a resume give the cache a build
from scratch gives; a 2-process training (forked ranks, helpers.training.train_on_ranks) from the
cache trains exactly as the live ViT.
(The model side, in process: tests/unit/test_vit_features.py.)
"""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import yaml

from helpers.model_cases import QWEN_DIR
from helpers.precompute_runs import flip_byte
from helpers.profiles import file_digests, write_test_profile
from helpers.sources import (
    ROWS_PER_SHARD,
    STEPS,
    assert_one_line_error,
    janus_cache_in_process,
    precompute_in_process,
    tail,
)
from helpers.training import train_on_ranks
from janus_cache.store import CacheOpenError, open_cache, read_manifest
from janus_cache.store.commit import read_record
from janus_cache.store.layout import CacheLayout, vit_array
from janus_cache.store.open import reader_of
from janus_cache.store.zarr_group import ZarrGroup
from janus_core.profile import load_profile
from janus_core.qwen_vit import ViTEncoder
from janus_train.data.from_profile import open_training_cache

RESOLUTION = "pad224"
TOKENS, VIT_DIM = 16 * 16, 32  # pad224: a 16x16 patch grid; the tiny ViT's hidden size (config.json)


# ------------------------------------------------------------------------------ cache side


@pytest.fixture(scope="module")
def vit_profile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny profile caching ViT features, 4 rows per shard (source A's 10 frames end in a
    partially filled shard, which an append rewrites)."""
    return write_test_profile(tmp_path_factory.mktemp("vit-profile") / "vit.yaml", cache={
        "frames_per_shard": ROWS_PER_SHARD, "samples_per_shard": ROWS_PER_SHARD, "vit_features": True})


@pytest.fixture(scope="module")
def caches(sources: tuple[Path, Path], vit_profile: Path,
           tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Per format, the cache of source A alone (``<format>-a``) and of A and B (``<format>-ab``), built
    from scratch (read-only: copy one to change it)."""
    a, b = sources
    root = tmp_path_factory.mktemp("vit-caches")
    built = {}
    for cache_format in ("zarr", "wds"):
        for name, data in (("a", [f"r2r={a}"]), ("ab", [f"r2r={a}", f"d1={b}"])):
            out = root / f"{cache_format}-{name}"
            result = precompute_in_process(out, vit_profile, *data, cache_format=cache_format)
            assert result.returncode == 0, tail(result)
            if (cache_format, name) == ("zarr", "a"):
                assert "ViT features 256x32 per frame" in result.stdout  # the plan reports their bytes
            built[f"{cache_format}-{name}"] = out
    return built


@pytest.mark.parametrize("cache_format", ["zarr", "wds"])
def test_precompute_stores_each_frames_vit_output_once_and_the_reader_gives_each_sample_its_window(
    cache_format: str, caches: dict[str, Path], vit_profile: Path
) -> None:
    cache = caches[f"{cache_format}-ab"]
    manifest = read_manifest(cache)
    assert manifest is not None
    vit = ViTEncoder.from_profile(load_profile(vit_profile))
    entry = manifest.vit_features[RESOLUTION]
    assert (entry.fingerprint, entry.base_model, entry.dtype, entry.feature_shape) == (
        vit.fingerprint, "tiny-qwen2_5_vl", "float32", (TOKENS, VIT_DIM))  # float32: the tiny profile computes in it
    assert all(s.committed for s in manifest.shards[vit_array(RESOLUTION)])

    group = ZarrGroup(cache, read_only=True)
    stored = group.vit_features(RESOLUTION, range(3 * STEPS))
    assert stored.shape == (3 * STEPS, TOKENS, VIT_DIM)  # one row per frame, in both formats
    assert torch.equal(stored, vit.encode(torch.from_numpy(group.frames(RESOLUTION, range(3 * STEPS)))))

    opened = open_training_cache(load_profile(vit_profile), cache)
    samples = list(opened.reader) if cache_format == "wds" else [opened.reader[r] for r in range(len(opened.reader))]
    assert len(samples) == 3 * STEPS
    for sample in samples:
        assert torch.equal(sample.vit_features, stored[list(sample.meta.window_rows)]), sample.key
    plain = open_cache(cache, resolution=RESOLUTION, variant=manifest.window.name).reader
    assert next(iter(plain)).vit_features is None  # read only when asked for


def test_a_cache_without_vit_features_is_refused_in_one_line_for_a_profile_that_trains_from_them(
    caches: dict[str, Path]
) -> None:
    cache = caches["zarr-a"]
    manifest = read_manifest(cache)
    assert manifest is not None
    without = replace(manifest, vit_features={})  # what a precompute without cache.vit_features records
    with pytest.raises(CacheOpenError) as caught:
        reader_of(without, CacheLayout(cache), resolution=RESOLUTION, variant=manifest.window.name, vit_features=True)
    message = str(caught.value)
    assert "no ViT features at pad224" in message and "cache.vit_features" in message and "\n" not in message


@pytest.mark.parametrize("cache_format", ["zarr", "wds"])
def test_verify_live_compares_the_cached_vit_output_with_the_live_vit(
    cache_format: str, caches: dict[str, Path], vit_profile: Path, sources: tuple[Path, Path],
) -> None:
    a, b = sources
    result = janus_cache_in_process("verify", caches[f"{cache_format}-ab"], "--profile", vit_profile,
                         "--data", f"r2r={a} d1={b}", "--live", "3")
    assert result.returncode == 0, tail(result)
    live = next(line for line in result.stdout.splitlines() if line.startswith("live"))
    assert "pass" in live and "ViT features max abs 0 " in live, live
    fresh = next(line for line in result.stdout.splitlines() if line.startswith("freshness"))
    assert "ViT " in fresh and "float32 at pad224" in fresh, fresh


def test_a_flipped_byte_in_a_vit_shard_is_named_by_verify_and_repaired_by_precompute(
    caches: dict[str, Path], vit_profile: Path, sources: tuple[Path, Path], tmp_path: Path
) -> None:
    cache = Path(shutil.copytree(caches["wds-a"], tmp_path / "cache"))
    record = read_record(cache, vit_array(RESOLUTION), 1)
    assert record is not None
    shard = cache / record.file
    flip_byte(shard)
    result = janus_cache_in_process("verify", cache, "--profile", vit_profile)
    assert result.returncode != 0, tail(result)
    integrity = next(line for line in result.stdout.splitlines() if line.startswith("integrity"))
    assert "FAIL" in integrity, tail(result)
    named = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(named) == 1 and record.file in named[0], tail(result)
    assert "4 frames r2r/episode_0000/4, r2r/episode_0001/0" in named[0]  # rows 4-7 of the frames table

    # Repair: the same precompute, hashing committed shards, rewrites it from the stored frames.
    repaired = janus_cache_in_process("precompute", f"r2r={sources[0]}", "--out", cache, "--profile", vit_profile,
                           "--format", "wds", "--workers", "1", "--checksums", "all")
    assert repaired.returncode == 0, tail(repaired)
    assert file_digests(cache) == file_digests(caches["wds-a"])


def test_a_different_vit_is_refused_by_precompute_and_named_by_freshness(
    caches: dict[str, Path], vit_profile: Path, sources: tuple[Path, Path], tmp_path: Path
) -> None:
    settings = yaml.safe_load(vit_profile.read_text())
    settings["qwen"]["seed"] = 1  # another random ViT (the profile's base model, other weights)
    other = tmp_path / "other.yaml"
    other.write_text(yaml.safe_dump(settings, sort_keys=False))
    cache = Path(shutil.copytree(caches["zarr-a"], tmp_path / "cache"))
    before = file_digests(cache)
    refused = precompute_in_process(cache, other, f"r2r={sources[0]}")
    assert_one_line_error(refused, "vit_features.pad224.fingerprint")
    assert file_digests(cache) == before
    stale = janus_cache_in_process("verify", cache, "--profile", other)
    assert stale.returncode != 0 and "vit_features.pad224.fingerprint" in stale.stdout, tail(stale)


@pytest.mark.parametrize("cache_format", ["zarr", "wds"])
def test_appending_episodes_grows_the_vit_features_as_a_build_from_scratch(
    cache_format: str, caches: dict[str, Path], vit_profile: Path, sources: tuple[Path, Path],
    tmp_path: Path
) -> None:
    a, b = sources
    appended = Path(shutil.copytree(caches[f"{cache_format}-a"], tmp_path / "appended"))
    first = ZarrGroup(appended, read_only=True).shard_file(vit_array(RESOLUTION), 0)  # rows 0-3: a full shard
    kept = (first.stat().st_mtime_ns, first.read_bytes())
    result = precompute_in_process(appended, vit_profile, f"r2r={a}", f"d1={b}", cache_format=cache_format)
    assert result.returncode == 0, tail(result)
    assert "appending 1 new episode (" in result.stdout
    assert file_digests(appended) == file_digests(caches[f"{cache_format}-ab"])
    assert (first.stat().st_mtime_ns, first.read_bytes()) == kept  # a full old shard is not rewritten


def test_a_run_resumed_after_losing_vit_shards_rewrites_them_and_equals_an_uninterrupted_run(
    caches: dict[str, Path], vit_profile: Path, sources: tuple[Path, Path], tmp_path: Path
) -> None:
    a, b = sources
    cache = Path(shutil.copytree(caches["zarr-ab"], tmp_path / "cache"))
    layout = CacheLayout(cache)
    for shard in (0, 3):  # as a run killed before these shards' commits leaves them
        record = read_record(cache, vit_array(RESOLUTION), shard)
        assert record is not None
        (cache / record.file).unlink()
        layout.commit_record(vit_array(RESOLUTION), shard).unlink()
    result = precompute_in_process(cache, vit_profile, f"r2r={a}", f"d1={b}")
    assert result.returncode == 0, tail(result)
    assert "[ViT features]" in result.stdout + result.stderr
    assert file_digests(cache) == file_digests(caches["zarr-ab"])


def test_a_two_process_run_from_the_vit_cache_trains_exactly_as_the_live_vit(
    caches: dict[str, Path], vit_profile: Path, tmp_path: Path
) -> None:
    """No change to what a run trains: the same cache, sample order and seed give the same losses,
    bit for bit, whether the model runs the ViT or reads its cached output (ZeRO-3, 2 processes)."""
    losses = {}
    for vit_features in (True, False):
        settings = yaml.safe_load(vit_profile.read_text())
        settings["cache"]["vit_features"] = vit_features
        settings["train"].update({"max_steps": 3, "save_every": 100, "warmup_ratio": 0.0, "num_workers": 0})
        profile = tmp_path / f"train-{vit_features}.yaml"
        profile.write_text(yaml.safe_dump(settings, sort_keys=False))
        out = tmp_path / f"run-{vit_features}"
        result = train_on_ranks("--out", out, "--cache", caches["zarr-ab"], "--profile", profile)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        # The start line says which path trains.
        assert (" (the frozen ViT from the cache: only its mergers run)" in result.stdout) == vit_features
        losses[vit_features] = [json.loads(line)["loss"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(losses[True]) == 3
    assert losses[True] == losses[False]


def test_a_qwen_directory_without_weights_is_refused_in_one_line_by_a_precompute_caching_the_vit(
    vit_profile: Path, sources: tuple[Path, Path], tmp_path: Path
) -> None:
    qwen = Path(shutil.copytree(QWEN_DIR, tmp_path / "qwen-config-only"))
    settings = yaml.safe_load(vit_profile.read_text())
    settings["qwen"].update({"path": str(qwen), "random_init": False})
    profile = tmp_path / "no-weights.yaml"
    profile.write_text(yaml.safe_dump(settings, sort_keys=False))
    result = precompute_in_process(tmp_path / "cache", profile, f"r2r={sources[0]}")
    assert_one_line_error(result, str(qwen), "no *.safetensors weights", "qwen.random_init: true")
