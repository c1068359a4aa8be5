"""The commands on a Qwen3-VL cache (docs/bases.md): a precompute with the tiny-qwen3 profile on two
processes writes Qwen3-VL's frames, a verify with --live on two passes on it (pixel values, VGGT
features, fused embeddings with the DeepStack inputs), and ``make precompute`` or ``make train`` with a
Qwen2.5-VL profile stops on it in one line, changing nothing. The two-process commands' ranks start as
torchrun starts them (helpers.forked_ranks); ``make precompute`` and ``make verify`` of the tiny-qwen3
profile on two processes run in tests/e2e/test_qwen3_demo.py."""

from __future__ import annotations

from pathlib import Path

from helpers.commands import assert_one_error_line, make, set_options
from helpers.forked_ranks import forked_launch
from helpers.profiles import file_digests
from janus_cache.store import read_manifest
from janus_core.sample_data import write_sample_data

SMALL = "cache.resolution=pad56 cache.history=3 cache.frames_per_shard=4 cache.samples_per_shard=3"


def test_a_qwen3_cache_is_made_verified_live_and_refused_to_a_qwen25_profile(tmp_path: Path) -> None:
    data = write_sample_data(tmp_path / "data", episodes=2, steps=4, seed=1)
    cache = tmp_path / "cache"
    small = set_options(*SMALL.split())
    made = forked_launch("pipelines.precompute", data, "--out", cache, "--profile", "tiny-qwen3", *small)
    assert made.returncode == 0, made.stdout + made.stderr
    manifest = read_manifest(cache)
    assert manifest is not None and manifest.base == "qwen3_vl"
    assert manifest.resolutions["pad56"].frame_shape == (64, 64, 3)

    verified = forked_launch("pipelines.verify", cache, "--data", data, "--profile", "tiny-qwen3", *small,
                             "--live", "2")
    output = verified.stdout + verified.stderr
    assert verified.returncode == 0, output
    live = next(line for line in output.splitlines() if line.startswith("live "))
    assert " pass " in live and "frames and pixel_values bit-identical" in live and "embeddings max abs" in live, live

    before = file_digests(cache)
    refused = make("precompute", DATA=data, OUT=cache, PROFILE="tiny", NPROC=1, SET=SMALL)
    assert_one_error_line(refused, f"{cache} is a cache for Qwen3-VL", "Qwen2.5-VL model", "--overwrite")
    trained = make("train", CACHE=cache, RUN=tmp_path / "run", PROFILE="tiny", NPROC=1, SET=SMALL)
    assert_one_error_line(trained, f"{cache} is a cache for Qwen3-VL", "use a profile whose qwen.path is a Qwen3-VL")
    assert file_digests(cache) == before
