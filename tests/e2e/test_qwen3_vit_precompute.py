"""A precompute with the tiny-qwen3 profile and ``--set cache.vit_features=true`` (``make precompute
PROFILE=tiny-qwen3 SET=...``) on two processes caches the Qwen3-VL ViT's output per frame: its levels
(last block and DeepStack layers) are keyed in the manifest and read back equal to the frozen ViT run
on the stored frames. The ranks start as torchrun starts them (helpers.forked_ranks). (In process,
the training step and the store: tests/unit/test_vit_features.py, tests/unit/test_base_caches.py.)"""

from __future__ import annotations

from pathlib import Path

import torch

from helpers.commands import set_options
from helpers.forked_ranks import forked_launch
from janus_cache.keys import window_variant
from janus_cache.store import open_cache, read_manifest
from janus_core.profile import load_profile
from janus_core.qwen_vit import ViTEncoder
from janus_core.sample_data import write_sample_data

SETTINGS = ("cache.resolution=pad56", "cache.history=3", "cache.frames_per_shard=4", "cache.samples_per_shard=3",
            "cache.vit_features=true")


def test_a_two_process_qwen3_precompute_caches_its_vit_output_with_the_deepstack_levels(tmp_path: Path) -> None:
    data = write_sample_data(tmp_path / "data", episodes=2, steps=4, seed=1)
    cache = tmp_path / "cache"
    made = forked_launch("pipelines.precompute", data, "--out", cache, "--profile", "tiny-qwen3",
                         *set_options(*SETTINGS))
    assert made.returncode == 0, made.stdout + made.stderr

    manifest = read_manifest(cache)
    assert manifest is not None and manifest.base == "qwen3_vl"
    profile = load_profile("tiny-qwen3", SETTINGS)
    vit = ViTEncoder.from_profile(profile)
    entry = manifest.vit_features["pad56"]
    # 64x64 frames: 16 patches; the last block and the tiny ViT's 2 DeepStack layers; D = 32.
    assert entry.feature_shape == (3, 16, 32) and entry.fingerprint == vit.fingerprint
    reader = open_cache(cache, resolution="pad56", variant=window_variant(profile.cache).name, vit_features=True).reader
    for row in (0, len(reader) - 1):
        sample = reader[row]
        assert torch.equal(sample.vit_features, vit.encode(torch.from_numpy(sample.frames)))
