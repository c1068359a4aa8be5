"""M-RoPE position ids built with the batch: the loader's collate computes them
with each base's own code, the model takes them from the batch without walking the sequence, and a
step with them is the step without them, bit for bit."""

from __future__ import annotations

from unittest import mock

import pytest
import torch
from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLModel

from helpers.bases import BaseCase
from helpers.model_cases import QWEN_DIR, RESOLUTION, builder, tiny_model
from janus_core.index import DatasetIndex
from janus_train.data.rope import RopeIndex
from janus_train.data.samples import LiveSamples, TrainItem, collate
from janus_train.model.janus_model import JanusVLNModel


@pytest.fixture(scope="module")
def items(sample_index: DatasetIndex) -> list[TrainItem]:
    """Two real samples of different episodes: prompts of different lengths (one is padded)."""
    samples = LiveSamples(sample_index, builder(), RESOLUTION)
    return [samples[3], samples[22]]


def batch_of(items: list[TrainItem], with_positions: bool) -> dict[str, torch.Tensor]:
    rope = RopeIndex.from_dir(QWEN_DIR) if with_positions else None
    return collate(items, builder().pad_token_id, rope=rope)


def loss_and_gradients(model: JanusVLNModel, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict]:
    model.train()
    out = model(batch)
    loss = out.loss_parts.weighted_ce_sum.sum() + out.loss_parts.action_ce.sum()
    loss.backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return loss.detach(), grads


def test_collate_builds_the_position_ids_the_bases_get_rope_index_computes(base: BaseCase,
                                                                          sample_index: DatasetIndex) -> None:
    """The loader workers' collate gives a batch of the base's frames (Qwen3-VL's 64x64, not VGGT's
    or Qwen2.5-VL's 14-px grid) the ids the base's own get_rope_index gives its 4x4 patch grid."""
    samples = LiveSamples(sample_index, builder(), RESOLUTION, base.base)
    rope = RopeIndex.from_dir(base.qwen_dir)
    batch = collate([samples[3], samples[22]], builder().pad_token_id, rope=rope)
    lengths = batch["attention_mask"].sum(1)
    assert lengths[0] != lengths[1]  # right padding is covered
    _, images, height, width, _ = batch["frames"].shape
    grid = base.base.patch_grid(height, width)
    assert rope.patch_grid(height, width) == grid == (4, 4)
    model = tiny_model(base=base)
    expected, _ = model.qwen.model.get_rope_index(
        batch["input_ids"], batch["mm_token_type_ids"],
        image_grid_thw=torch.tensor([[1, *grid]]).expand(2 * images, 3), attention_mask=batch["attention_mask"])
    assert isinstance(model.qwen.model, base.base.transformers_class("inner"))
    assert batch["position_ids"].shape == (3, 2, batch["input_ids"].shape[1])
    assert torch.equal(batch["position_ids"], expected)


def test_a_step_with_the_loaders_positions_is_the_step_without_them(items: list[TrainItem]) -> None:
    without = batch_of(items, with_positions=False)
    assert "position_ids" not in without  # a batch built without them: the model computes them
    model = tiny_model(live=True)
    loss, grads = loss_and_gradients(model, without)
    loss_with, grads_with = loss_and_gradients(model, batch_of(items, with_positions=True))
    assert torch.equal(loss, loss_with)
    assert grads.keys() == grads_with.keys() and all(torch.equal(grads[k], grads_with[k]) for k in grads)


def test_the_forward_takes_the_batchs_positions_and_never_walks_the_sequence(items: list[TrainItem]) -> None:
    batch = batch_of(items, with_positions=True)
    model = tiny_model(live=True).eval()
    walked = AssertionError("the forward walked the sequence for its M-RoPE positions")
    with torch.no_grad(), mock.patch.object(Qwen2_5_VLModel, "get_rope_index", side_effect=walked):
        loss = model(batch).loss_parts.weighted_ce_sum
        # The positions given are the ones used.
        other = model({**batch, "position_ids": torch.zeros_like(batch["position_ids"])}).loss_parts.weighted_ce_sum
    assert not torch.equal(loss, other)
