"""The per-frame ViT-output cache (``cache.vit_features``) on Qwen3-VL.

Qwen3-VL's frozen ViT gives the LLM more than its last block: the outputs of blocks
``deepstack_visual_indexes`` pass their own (trainable) DeepStack mergers. So a Qwen3-VL frame's
cached output is ``[levels, grid tokens, D]``: the last block's hidden states, then each DeepStack
merger's input. In process, on the tiny Qwen3-VL (64x64 frames, pad56 VGGT features): a step from
cached ViT output equals the live step bit for bit (loss and every trainable gradient, CPU
float32) running only the mergers; the real precompute job stores those levels, keyed in the
manifest, and the reader gives each sample its window's; wrong levels or a training tower are
refused in one line; verify checks it fresh and live. (The CLI precompute: tests/e2e/test_qwen3_vit_precompute.py.)
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer

from helpers.model_cases import FEATURE_DIM, MERGER_HIDDEN, tiny_encoder, window_frames
from janus_cache.keys import window_variant
from janus_cache.job import PrecomputeJob, precompute_base
from janus_cache.store import open_cache, read_manifest
from janus_cache.verify import check_cache_for_training
from janus_cache.verify.live import check_live
from janus_core.bases import QWEN3_VL
from janus_core.vggt.encoder import WindowEncoder
from janus_core.imaging import load_qwen_frame
from janus_core.index import DatasetIndex, Sample, build_index
from janus_core.profile import LanguageModelSettings, Profile, load_profile
from janus_core.sample_data import write_sample_data
from janus_core.qwen_vit import ViTEncoder, load_vision_tower, vit_fingerprint
from janus_train.data.prompt import PromptBuilder
from janus_train.model.janus_model import JanusModelConfig, JanusVLNModel, ModelInputError, load_qwen

REPO = Path(__file__).resolve().parents[2]
QWEN3_DIR = REPO / "configs" / "models" / "tiny-qwen3_vl"
TOKENS = 4  # a 64x64 Qwen3-VL frame: 4x4 patches of 16 px, 2x2 visual tokens
PATCHES = 16
VIT_DIM = 32  # the tiny Qwen3-VL ViT's hidden size (config.json)
LEVELS = 3  # the last block and the tiny ViT's two DeepStack layers
SMALL = ("cache.resolution=pad56", "cache.frames_per_shard=4", "cache.samples_per_shard=3", "cache.history=3",
         "cache.vit_features=true")


def tiny_qwen3_vit() -> ViTEncoder:
    """The tiny Qwen3-VL's frozen ViT as precompute builds it (seed 0, float32), one window per call."""
    visual = load_vision_tower(LanguageModelSettings(path=QWEN3_DIR, random_init=True, seed=0))
    return ViTEncoder(visual, "float32", 9, vit_fingerprint(visual), QWEN3_DIR.name, QWEN3_VL)


def tiny_qwen3_model() -> JanusVLNModel:
    qwen = load_qwen(LanguageModelSettings(path=QWEN3_DIR, random_init=True, seed=0))
    return JanusVLNModel(qwen, FEATURE_DIM, JanusModelConfig(lam=0.2, merger_hidden=MERGER_HIDDEN)).eval()


def qwen3_batch(index: DatasetIndex, samples: list[Sample]) -> dict[str, torch.Tensor]:
    """Prompt tensors, 64x64 Qwen3-VL frames and the tiny VGGT's pad56 features of real samples."""
    builder = PromptBuilder(AutoTokenizer.from_pretrained(QWEN3_DIR), TOKENS)
    batch = builder.collate([builder.build_sample(s) for s in samples])
    batch["frames"] = torch.stack([torch.from_numpy(np.stack(
        [load_qwen_frame(frame.path, "pad56", QWEN3_VL) for frame in index.window(s)])) for s in samples])
    batch["features"] = tiny_encoder().encode(torch.stack([window_frames(index, s) for s in samples]))
    return batch


def cached_vit_features(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    b, s, h, w, _ = batch["frames"].shape
    return tiny_qwen3_vit().encode(batch["frames"].reshape(b * s, h, w, 3)).reshape(b, s, LEVELS, PATCHES, VIT_DIM)


def step(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Loss of one micro-batch and the gradient of every trainable parameter after its backward."""
    model.zero_grad(set_to_none=True)
    parts = model(batch).loss_parts
    loss = parts.weighted_ce_sum.sum() + parts.action_ce.sum()
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}


@pytest.fixture(scope="module")
def batch(sample_index: DatasetIndex) -> dict[str, torch.Tensor]:
    """Two samples of different episodes: different texts, windows and features."""
    return qwen3_batch(sample_index, [sample_index.samples[3], sample_index.samples[22]])


def test_a_qwen3_step_from_cached_vit_output_equals_the_live_step_running_only_the_mergers(
    batch: dict[str, torch.Tensor],
) -> None:
    model = tiny_qwen3_model()
    vit = cached_vit_features(batch)
    visual = model.qwen.model.visual
    assert list(visual.deepstack_visual_indexes) and vit.shape == (2, 9, LEVELS, PATCHES, VIT_DIM)

    live_loss, live_grads = step(model, batch)
    ran: list[str] = []
    hooks = [visual.patch_embed.register_forward_hook(lambda *_: ran.append("patch_embed")),
             visual.blocks[0].register_forward_hook(lambda *_: ran.append("block 0")),
             visual.merger.register_forward_hook(lambda *_: ran.append("merger")),
             *(m.register_forward_hook(lambda *_, i=i: ran.append(f"deepstack merger {i}"))
               for i, m in enumerate(visual.deepstack_merger_list))]
    cached_loss, cached_grads = step(model, {**batch, "vit_features": vit})
    for hook in hooks:
        hook.remove()

    assert ran == ["merger", "deepstack merger 0", "deepstack merger 1"]  # no pixel values, no ViT block
    assert torch.equal(live_loss, cached_loss)
    assert live_grads.keys() == cached_grads.keys()
    assert any(".deepstack_merger_list." in name for name in cached_grads)  # they train from the cache
    for name, grad in live_grads.items():
        assert torch.equal(grad, cached_grads[name]), name


def test_cached_qwen3_vit_output_of_other_levels_or_with_a_training_tower_is_refused_in_one_line(
    batch: dict[str, torch.Tensor],
) -> None:
    vit = cached_vit_features(batch)
    with pytest.raises(ModelInputError, match=r"vit_features have shape \(2, 9, 16, 32\), expected "
                                              r"\[2, 9, 3, 16, 32\] \(batch, frames, ViT levels"):
        tiny_qwen3_model()({**batch, "vit_features": vit[:, :, 0]})  # the last block only, no DeepStack
    model = tiny_qwen3_model()
    model.qwen.model.visual.blocks[0].requires_grad_(True)
    with pytest.raises(ModelInputError, match="the vision tower trains"):
        model({**batch, "vit_features": vit})


@pytest.fixture(scope="module")
def profile() -> Profile:
    return load_profile("tiny-qwen3", SMALL)


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> DatasetIndex:
    data = write_sample_data(tmp_path_factory.mktemp("qwen3vitdata") / "data", episodes=2, steps=4, seed=5)
    return build_index(data, history=3)


@pytest.mark.parametrize("cache_format", ["zarr", "wds"])
def test_precompute_stores_qwen3_vit_levels_keyed_and_the_reader_gives_each_sample_its_windows(
    profile: Profile, index: DatasetIndex, cache_format: str, tmp_path: Path,
) -> None:
    vit = ViTEncoder.from_profile(profile)
    assert vit.base is QWEN3_VL and vit.feature_shape(64, 64) == (LEVELS, PATCHES, VIT_DIM)
    job = PrecomputeJob(index, tmp_path / "cache", cache_format, profile.cache, profile.cache.resolution,
                        WindowEncoder.from_settings(profile.vggt, profile.cache), vit, base=precompute_base(profile))
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
    reader = open_cache(job.out, resolution="pad56", variant=window_variant(profile.cache).name,
                        vit_features=True).reader
    samples = list(reader) if cache_format == "wds" else [reader[row] for row in range(len(reader))]
    assert len(samples) == len(index.samples)
    for sample in samples[:3]:
        frames = torch.from_numpy(np.asarray(sample.frames))
        assert frames.shape == (4, 64, 64, 3)
        assert torch.equal(sample.vit_features, vit.encode(frames))  # [S, levels, tokens, D]

    check_cache_for_training(job.out, profile)  # fresh for the profile that made it: no exception
    live = check_live(job.out, profile, index, [0, len(index.samples) - 1], device="cpu", vit=vit)
    assert live.passed, live.problems
    assert len(live.data["samples"]) == 2 and live.data["vit_features"]["max_abs"] == 0.0
