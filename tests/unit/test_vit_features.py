"""The frozen Qwen ViT's output cached per frame (``cache.vit_features``): the model side.

In process, the tiny model of each base at pad56: a step whose batch carries the frames' cached ViT
output equals the live step bit for bit (loss and every trainable gradient, CPU float32) without
running a ViT block (Qwen3-VL's DeepStack mergers run on their cached levels); output of another
shape, or a model whose vision tower trains, is refused, and so is such a profile. (The cache side,
precompute, verify and training from such a cache: tests/e2e/test_vit_cache.py; Qwen3-VL's levels
stored by precompute: tests/unit/test_base_caches.py.)
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from helpers.bases import QWEN2_5, BaseCase
from helpers.model_cases import QWEN_DIR, make_batch, tiny_model, tiny_vit
from helpers.profiles import write_test_profile
from janus_core.imaging import qwen_pixel_values
from janus_core.index import DatasetIndex
from janus_core.profile import LanguageModelSettings, load_profile
from janus_core.qwen_vit import ViTEncoder, load_vision_tower, merge_cached, vit_blocks, vit_fingerprint
from janus_core.qwen_vit import merge as vit_merge
from janus_train.config import load_train_settings
from janus_train.model.janus_model import ModelInputError, TrainableParts

VIT_DIM = 32  # the tiny ViT's hidden size (config.json)


def cached_vit_features(batch: dict[str, torch.Tensor], base: BaseCase = QWEN2_5) -> torch.Tensor:
    """The batch's frames through the base's frozen ViT as precompute runs it: [B, S, *feature shape]."""
    b, s, h, w, _ = batch["frames"].shape
    vit = tiny_vit(base)
    return vit.encode(batch["frames"].reshape(b * s, h, w, 3)).reshape(b, s, *vit.feature_shape(h, w))


def step(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Loss of one micro-batch and the gradient of every trainable parameter after its backward."""
    model.zero_grad(set_to_none=True)
    parts = model(batch).loss_parts
    loss = parts.weighted_ce_sum.sum() + parts.action_ce.sum()
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}


def test_a_step_from_cached_vit_features_equals_the_live_step_running_only_the_mergers(
    base: BaseCase, sample_index: DatasetIndex
) -> None:
    """On each base; Qwen3-VL's cached output per frame is ``[levels, grid tokens, D]``: the last
    block's hidden states, then each DeepStack merger's input, and its DeepStack mergers train from it."""
    batch = make_batch(sample_index, sample_index.samples[10:12], base=base)
    model = tiny_model(base=base)
    vit = cached_vit_features(batch, base)
    visual = model.qwen.model.visual
    deepstack_mergers = list(getattr(visual, "deepstack_merger_list", ()))
    # pad56: 4x4 patches per frame; Qwen3-VL's levels: the last block and the tiny ViT's two DeepStack layers
    assert vit.shape == ((2, 9, 3, 4 * 4, VIT_DIM) if base.base.deepstack else (2, 9, 4 * 4, VIT_DIM))
    assert len(deepstack_mergers) == (2 if base.base.deepstack else 0)

    live_loss, live_grads = step(model, batch)
    ran: list[str] = []
    hooks = [visual.patch_embed.register_forward_hook(lambda *_: ran.append("patch_embed")),
             visual.blocks[0].register_forward_hook(lambda *_: ran.append("block 0")),
             visual.merger.register_forward_hook(lambda *_: ran.append("merger")),
             *(m.register_forward_hook(lambda *_, i=i: ran.append(f"deepstack merger {i}"))
               for i, m in enumerate(deepstack_mergers))]
    cached_loss, cached_grads = step(model, {**batch, "vit_features": vit})
    for hook in hooks:
        hook.remove()

    # No pixel values, no patch embedding, no ViT block: the mergers only.
    assert ran == ["merger", *(f"deepstack merger {i}" for i in range(len(deepstack_mergers)))]
    assert torch.equal(live_loss, cached_loss)
    assert live_grads.keys() == cached_grads.keys()
    assert any(name.startswith("qwen.model.visual.merger.") for name in cached_grads)
    assert any(".deepstack_merger_list." in name for name in cached_grads) == base.base.deepstack
    for name, grad in live_grads.items():
        assert torch.equal(grad, cached_grads[name]), name


def test_at_pad224_the_merger_sees_cached_rows_in_the_live_order_and_its_gradients_are_bit_identical() -> None:
    """At 224 px a frame's 64 merge groups span 4 attention windows, so the blocks' window order is
    not the patch order: the merger must run on the cached rows in the live order, or the token sums
    of its weight gradients (and so training) would differ in the last bits."""
    vit = tiny_vit()
    visual = vit.visual
    frames = torch.randint(0, 256, (3, 224, 224, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    pixel_values, grid_thw = qwen_pixel_values(frames)
    _, window_index = vit_blocks(visual, pixel_values, grid_thw)
    assert not torch.equal(window_index, torch.arange(len(window_index)))  # the orders differ here
    probe = torch.randn(3 * 64, 64, generator=torch.Generator().manual_seed(1))

    def merger_grads(embeddings: Callable[[], torch.Tensor]) -> tuple[torch.Tensor, list[torch.Tensor]]:
        visual.merger.requires_grad_(True)
        visual.zero_grad(set_to_none=True)
        out = embeddings()
        (out * probe).sum().backward()
        return out.detach(), [p.grad.clone() for p in visual.merger.parameters()]

    live_out, live = merger_grads(lambda: vit_merge(visual, *vit_blocks(visual, pixel_values, grid_thw)))
    cached_out, cached = merger_grads(lambda: merge_cached(visual, vit.encode(frames), (16, 16)))
    assert torch.equal(live_out, cached_out)
    assert all(torch.equal(a, b) for a, b in zip(live, cached, strict=True))


def test_cached_vit_features_of_another_shape_or_with_a_training_tower_are_refused_in_one_line(
    base: BaseCase, sample_index: DatasetIndex
) -> None:
    batch = make_batch(sample_index, sample_index.samples[10:11], base=base)
    vit = cached_vit_features(batch, base)
    model = tiny_model(trainable=TrainableParts(vision_tower=True), base=base)
    with pytest.raises(ModelInputError, match="the vision tower trains"):
        model({**batch, "vit_features": vit})
    frozen = tiny_model(base=base)
    # The other base's layout: Qwen3-VL's last block only (no DeepStack levels), Qwen2.5-VL's with levels.
    for wrong in (vit[..., :31], vit[:, :, 0] if base.base.deepstack else vit[:, :, None]):
        expected = [1, 9, *vit.shape[2:]]
        with pytest.raises(ModelInputError, match=rf"^vit_features have shape {re.escape(str(tuple(wrong.shape)))}, "
                                                  rf"expected {re.escape(str(expected))} \(batch, frames, "
                                                  rf"{re.escape(base.base.vit_feature_dims)}\)$"):
            frozen({**batch, "vit_features": wrong})


def test_a_profile_training_the_vision_tower_from_cached_vit_features_is_refused_in_one_line(tmp_path: Path) -> None:
    profile = write_test_profile(tmp_path / "p.yaml", cache={"vit_features": True})
    text = profile.read_text().replace("train:\n", "train:\n  train_vision: true\n", 1)
    profile.write_text(text)
    with pytest.raises(ValueError) as caught:
        load_train_settings(load_profile(profile))
    message = str(caught.value)
    assert "\n" not in message and str(profile) in message
    assert "'train.train_vision'" in message and "'cache.vit_features'" in message


def test_the_vision_tower_of_a_checkpoint_loads_alone_as_the_model_holds_it(tmp_path: Path) -> None:
    """Precompute reads only the checkpoint's ``visual.*`` tensors (never the language model): the
    tower it builds has the weights (fingerprint) and the output of the trained model's tower."""
    qwen = tiny_model().qwen
    qwen.save_pretrained(tmp_path / "qwen")
    for extra in ("preprocessor_config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(QWEN_DIR / extra, tmp_path / "qwen" / extra)
    alone = load_vision_tower(LanguageModelSettings(path=tmp_path / "qwen", random_init=False))
    assert vit_fingerprint(alone) == vit_fingerprint(qwen.model.visual) == tiny_vit().fingerprint
    frames = torch.randint(0, 256, (3, 56, 56, 3), dtype=torch.uint8)
    assert torch.equal(ViTEncoder(alone, "float32", 9, "", "").encode(frames), tiny_vit().encode(frames))
