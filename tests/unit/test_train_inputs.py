"""Stage 2's inputs and start-up check, in this process: the trainer's data path from the
cache and live give the same features and loss, a micro-batch of two gives each sample its own
results, and the start-up check refuses caches of other settings or with broken layouts.

The data: the session's 8 samples precomputed into a float32 and a bfloat16 zarr cache
(helpers.shared_runs); the runs that train on them are tests/e2e/test_train.py.
"""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from helpers.shared_runs import TinyTraining
from helpers.training import write_train_profile
from janus_cache.verify import STORAGE_ULP
from janus_core.index import build_index
from janus_core.profile import load_profile
from janus_core.resolution import Resolution
from janus_train.build import prompt_builder
from janus_train.data.from_profile import open_training_cache
from janus_train.data.samples import CachedSamples, LiveSamples, collate
from janus_train.model.janus_model import JanusOutput
from pipelines.train_run import cache_refusal


@pytest.fixture
def setup(tiny_training: TinyTraining) -> TinyTraining:
    """The session's 8-sample data and its float32 and bfloat16 caches."""
    return tiny_training


def loss_parts(out: JanusOutput) -> dict[str, torch.Tensor]:
    return {"segment_ce_sum": out.loss_parts.segment_ce_sum.detach(), "action_logits": out.action_logits.detach()}


# ----------------------------------------------------------------------------------------------
# inputs: cached vs live, micro-batch 2 vs 1


@pytest.mark.parametrize("features", ["float32", "bfloat16"])
def test_cached_and_live_inputs_give_the_same_loss(setup: TinyTraining, features: str) -> None:
    """The same sample through the trainer's data path, once from the cache and once live (PNG
    decode + the frozen VGGT inside the model): the same prompt and frames, the same features up
    to one storage rounding step, and the same loss.

    Tolerance: both paths round the same VGGT output to the feature dtype, so they can differ only
    where a batch-composition difference flips a rounding: at most one storage step (2**-7
    relative for bfloat16, 2**-23 for float32) of the feature. Removing the feature entirely moves
    the loss by a relative S (measured: ~1e-2); to first order one storage step moves it by at most
    ulp x S, the bound used (plus float32 noise)."""
    profile, cache = setup.profile(features), setup.fp32_cache if features == "float32" else setup.bf16_cache
    builder = prompt_builder(profile)
    cached = CachedSamples(open_training_cache(profile, cache).reader, builder)
    live = LiveSamples(build_index(setup.data, history=profile.cache.history), builder,
                       Resolution.parse(profile.cache.resolution))
    model = setup.model(features, live=True).eval()
    ulp = STORAGE_ULP[features]
    for row in (0, len(cached) - 1):
        c, item = cached[row], live[row]
        assert c.key == item.key and item.features is None
        assert torch.equal(c.frames, item.frames)
        for name in ("input_ids", "labels", "segment_ids", "mm_token_type_ids"):
            assert torch.equal(getattr(c.prompt, name), getattr(item.prompt, name)), name
        without = replace(c, features=torch.zeros_like(c.features))
        with torch.no_grad():
            out_cached, out_live, out_without = (model(collate([x], builder.pad_token_id)) for x in (c, item, without))
        scale = out_cached.features.float().abs().max()
        assert (out_cached.features.float() - out_live.features.float()).abs().max() <= ulp * scale
        reference = out_live.loss_parts.segment_ce_sum
        sensitivity = ((out_without.loss_parts.segment_ce_sum - reference).abs() / reference).max().item()
        assert sensitivity > 1e-3, "the feature barely changes the loss: the comparison would prove nothing"
        tolerance = ulp * sensitivity + 1e-6
        assert torch.allclose(out_cached.loss_parts.segment_ce_sum, reference, rtol=tolerance, atol=0)
        assert torch.allclose(out_cached.action_logits, out_live.action_logits, rtol=tolerance, atol=1e-6)


def test_micro_batch_of_two_gives_each_sample_its_own_results(setup: TinyTraining) -> None:
    """Two cached samples collated into one micro-batch give the per-sample loss sums and action
    logits that each gives alone: each sample's feature reaches that sample's images only (and
    padding changes nothing). Swapping the features between the two samples must change them."""
    profile = setup.profile("bfloat16")
    builder = prompt_builder(profile)
    cached = CachedSamples(open_training_cache(profile, setup.bf16_cache).reader, builder)
    items = [cached[0], cached[len(cached) - 1]]
    assert len(items[0].prompt) != len(items[1].prompt), "pick samples of different lengths (padding)"
    model = setup.model("bfloat16").eval()
    with torch.no_grad():
        pair = loss_parts(model(collate(items, builder.pad_token_id)))
        alone = [loss_parts(model(collate([item], builder.pad_token_id))) for item in items]
        swapped_items = [replace(items[0], features=items[1].features), replace(items[1], features=items[0].features)]
        swapped = loss_parts(model(collate(swapped_items, builder.pad_token_id)))
    rtol = atol = 1e-5
    for i in range(2):
        for name in ("segment_ce_sum", "action_logits"):
            want = alone[i][name][0]
            assert torch.allclose(pair[name][i], want, rtol=rtol, atol=atol), (name, i)
            # The wrong sample's feature misses the tolerance by far (>= 10x) in some element.
            allowed = atol + rtol * want.abs()
            assert ((swapped[name][i] - want).abs() / allowed).max() > 10, (name, i)


# ----------------------------------------------------------------------------------------------
# start-up check


def test_start_up_check_refuses_a_cache_of_another_encoder(setup: TinyTraining, tmp_path: Path) -> None:
    profile = load_profile(write_train_profile(tmp_path / "seed.yaml", cache={"feature_dtype": "float32"},
                                               vggt={"seed": 1}))
    refusal = cache_refusal(setup.fp32_cache, profile)
    assert refusal is not None and "encoder_fingerprint" in refusal
    assert cache_refusal(setup.fp32_cache, setup.profile()) is None
    bf16 = cache_refusal(setup.bf16_cache, setup.profile())
    assert bf16 is not None and "feature_dtype" in bf16


def damage_unfinished(cache: Path) -> str:
    (cache / "report.json").unlink()
    return "did not finish"


def damage_manifest(cache: Path) -> str:
    (cache / "manifest.json").write_text('{"schema_version": ')
    return "manifest.json"


def damage_features(cache: Path) -> str:
    shutil.rmtree(cache / "vggt")
    return "vggt/"


@pytest.mark.parametrize("damage", [damage_unfinished, damage_manifest, damage_features],
                         ids=["unfinished-precompute", "corrupt-manifest", "missing-feature-array"])
def test_start_up_check_refuses_a_damaged_cache(setup: TinyTraining, tmp_path: Path, damage: Any) -> None:
    """The start-up check is verify's schema + freshness (shard checksums are ``janus-cache
    verify``'s integrity check): it refuses caches whose layout is broken, naming what is wrong."""
    cache = Path(shutil.copytree(setup.fp32_cache, tmp_path / "cache"))
    expected = damage(cache)
    refusal = cache_refusal(cache, setup.profile())
    assert refusal is not None and expected in refusal, refusal
