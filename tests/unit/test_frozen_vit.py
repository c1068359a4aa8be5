"""Frozen means outside autograd: on the tiny model, Qwen's frozen ViT records no
graph and runs nothing in the backward under any activation-checkpointing policy; only decoder
layers recompute, counted among decoder layers; and the gradients are bit for bit those of the way
janus ran before (transformers' ``activation_checkpointing_enable`` and the ViT as one call)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from unittest import mock

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import Qwen2_5_VLConfig

import janus_train.model.janus_model
from benchmarks.flops import build_model
from helpers.model_cases import QWEN_DIR, make_batch, tiny_model
from janus_core.index import DatasetIndex
from janus_train.model.activation_checkpointing import FULL, NONE, ActivationCheckpointing
from janus_train.model.janus_model import JanusVLNModel, TrainableParts

POLICIES = (NONE, ActivationCheckpointing(2), FULL)
DECODER_LAYERS = 2  # the tiny Qwen's


@pytest.fixture(scope="module")
def batch(sample_index: DatasetIndex) -> dict[str, torch.Tensor]:
    """Two real samples of different episodes (padding included), with cached features."""
    return make_batch(sample_index, [sample_index.samples[3], sample_index.samples[22]])


def loss_of(model: JanusVLNModel, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    out = model(batch)
    return out.loss_parts.weighted_ce_sum.sum() + out.loss_parts.action_ce.sum()


def trainable_gradients(model: JanusVLNModel, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    model.train()
    loss_of(model, batch).backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.requires_grad}
    model.zero_grad(set_to_none=True)
    return grads


def before_the_fix(policy: ActivationCheckpointing) -> JanusVLNModel:
    """The tiny model as janus set it up before: checkpointing through transformers' own
    ``activation_checkpointing_enable`` (which hooks every nested input embedding, the ViT's
    ``patch_embed`` too)."""
    model = tiny_model()
    if policy.enabled:
        model.qwen.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False},
                                                   every_n_layers=policy.every)
    return model


@contextmanager
def vit_as_one_call() -> Iterator[None]:
    """The ViT run as before the fix: one call of the whole tower, in whatever grad mode."""
    with mock.patch.object(janus_train.model.janus_model, "vit_embeddings",
                           lambda visual, pixel_values, grid_thw: visual(pixel_values, grid_thw=grid_thw).pooler_output):
        yield


@contextmanager
def recorded_vit_outputs(model: JanusVLNModel) -> Iterator[list[torch.Tensor]]:
    """The output of every ViT block (and the patch embedding) of the forwards inside."""
    outputs: list[torch.Tensor] = []
    visual = model.qwen.model.visual
    hooks = [module.register_forward_hook(lambda _m, _i, out: outputs.append(out))
             for module in (visual.patch_embed, *visual.blocks)]
    try:
        yield outputs
    finally:
        for hook in hooks:
            hook.remove()


class AttentionCalls(TorchDispatchMode):
    """Counts attention kernels: backward calls, and forward calls (inside a backward: recomputes)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        name = str(func.overloadpacket)
        if "scaled_dot_product" in name or "attention" in name:
            self.calls["backward" if name.endswith("_backward") else "forward"] += 1
        return func(*args, **(kwargs or {}))


def attention_calls_in_backward(model: JanusVLNModel, batch: dict[str, torch.Tensor]) -> Counter[str]:
    model.train()
    loss = loss_of(model, batch)
    with AttentionCalls() as counter:
        loss.backward()
    model.zero_grad(set_to_none=True)
    return counter.calls


# ---------------------------------------------------------------------------------- the tests


@pytest.mark.parametrize("policy", POLICIES, ids=str)
def test_no_frozen_vit_output_has_a_grad_fn(batch: dict[str, torch.Tensor], policy: ActivationCheckpointing) -> None:
    model = tiny_model()
    model.set_gradient_checkpointing(policy)
    model.train()
    with recorded_vit_outputs(model) as outputs:
        out = model(batch)
    assert len(outputs) == 1 + len(model.qwen.model.visual.blocks)
    assert all(o.grad_fn is None and not o.requires_grad for o in outputs)
    # The trainable patch merger (the projector) and what follows do record their graph.
    assert out.loss_parts.weighted_ce_sum.grad_fn is not None


def test_a_trained_vision_tower_stays_in_autograd(batch: dict[str, torch.Tensor]) -> None:
    model = tiny_model(trainable=TrainableParts(vision_tower=True))
    model.set_gradient_checkpointing(FULL)
    model.train()
    with recorded_vit_outputs(model) as outputs:
        loss_of(model, batch).backward()
    assert all(o.grad_fn is not None for o in outputs)
    assert model.qwen.model.visual.blocks[0].attn.qkv.weight.grad is not None


@pytest.mark.parametrize("policy", POLICIES, ids=str)
def test_trainable_gradients_are_bit_identical_to_before_the_fix(batch: dict[str, torch.Tensor],
                                                                   policy: ActivationCheckpointing) -> None:
    with vit_as_one_call():
        before_model = before_the_fix(policy)
        with recorded_vit_outputs(before_model) as outputs:
            before = trainable_gradients(before_model, batch)
    # The reference really is the old behaviour: with checkpointing on, the ViT was in autograd.
    assert any(o.grad_fn is not None for o in outputs) == policy.enabled
    model = tiny_model()
    model.set_gradient_checkpointing(policy)
    after = trainable_gradients(model, batch)
    assert after.keys() == before.keys() and len(after) > 0
    for name, grad in after.items():
        assert torch.equal(grad, before[name]), name


@pytest.mark.parametrize("policy", POLICIES, ids=str)
def test_attention_backward_runs_once_per_decoder_layer_and_recomputes_only_checkpointed_ones(
        batch: dict[str, torch.Tensor], policy: ActivationCheckpointing) -> None:
    model = tiny_model()
    model.set_gradient_checkpointing(policy)
    calls = attention_calls_in_backward(model, batch)
    assert calls["backward"] == DECODER_LAYERS
    assert calls["forward"] == sum(policy.checkpointed(DECODER_LAYERS))


def test_before_the_fix_the_frozen_vit_ran_in_the_backward(batch: dict[str, torch.Tensor]) -> None:
    """What the counts above guard against: transformers' own enabling put every ViT attention window
    into the backward and the recompute."""
    with vit_as_one_call():
        calls = attention_calls_in_backward(before_the_fix(FULL), batch)
    assert calls["backward"] > DECODER_LAYERS and calls["forward"] > DECODER_LAYERS


def test_every_k_counts_decoder_layers_only_and_never_checkpoints_vit_blocks() -> None:
    """3 ViT blocks before 4 decoder layers: every_2 is decoder layers 0 and 2."""
    config = json.loads((Path(QWEN_DIR) / "config.json").read_text())
    config["text_config"]["num_hidden_layers"] = 4
    config["vision_config"].update(depth=3, fullatt_block_indexes=[2])
    model = build_model(Qwen2_5_VLConfig.from_dict(config), 128, merger_hidden=96)
    for policy, expected in ((ActivationCheckpointing(2), [True, False, True, False]), (FULL, [True] * 4),
                             (ActivationCheckpointing(3), [True, False, False, True]), (NONE, [False] * 4)):
        model.set_gradient_checkpointing(policy)
        assert [layer.gradient_checkpointing for layer in model.qwen.model.language_model.layers] == expected
        assert not any(block.gradient_checkpointing for block in model.qwen.model.visual.blocks)


def test_setting_a_policy_removes_the_input_grad_hooks_transformers_left(batch: dict[str, torch.Tensor]) -> None:
    model = tiny_model()
    model.qwen.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    assert model.qwen._require_grads_hooks  # one per nested input embedding: the ViT's patch_embed too
    visual = model.qwen.model.visual
    for policy in (FULL, NONE):
        model.set_gradient_checkpointing(policy)
        assert not getattr(model.qwen, "_require_grads_hooks", None)
        pixel_values = torch.zeros(4, visual.patch_embed.proj.weight[0].numel())
        assert not visual.patch_embed(pixel_values).requires_grad
        assert model.gradient_checkpointing == policy.enabled
