"""Qwen's ViT attention as one varlen call: janus models use it, and it computes what transformers'
own sdpa path computes (exactly on the CPU, within bf16 rounding with the CUDA kernel)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from helpers.model_cases import QWEN_DIR, tiny_model
from janus_core.profile import LanguageModelSettings
from janus_train.model.janus_model import TrainableParts, load_qwen
from janus_train.model.vision_attention import VARLEN_ATTENTION, use_varlen_vision_attention, varlen_attention_forward

# Two images of 16x16 and 8x12 patches: four 8x8-patch windows and two partial ones in the
# windowed layer, whole images in the full-attention layer.
GRID = torch.tensor([[1, 16, 16], [1, 8, 12]])
TRAIN_VIT = TrainableParts(vision_tower=True)


def vit_outputs(model: torch.nn.Module, device: str = "cpu", dtype: torch.dtype = torch.float32
                ) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The ViT's merged embeddings of fixed random pixels, and the gradients of their sum."""
    visual = model.qwen.model.visual.to(device, dtype)
    generator = torch.Generator().manual_seed(0)
    pixels = torch.randn(int(GRID.prod(-1).sum()), 3 * 2 * 14 * 14, generator=generator).to(device, dtype)
    visual.zero_grad(set_to_none=True)
    embeddings = visual(pixels, grid_thw=GRID.to(device)).pooler_output
    embeddings.float().square().sum().backward()
    return embeddings.detach().float().cpu(), [p.grad.float().cpu() for p in visual.parameters()]


def sdpa_twin() -> torch.nn.Module:
    """The same tiny model on transformers' own per-window sdpa path."""
    model = tiny_model(trainable=TRAIN_VIT)
    model.qwen.config.vision_config._attn_implementation = "sdpa"
    return model


def test_janus_models_use_varlen_vision_attention_and_save_no_runtime_name(tmp_path: Path) -> None:
    model = tiny_model()
    assert model.qwen.config.vision_config._attn_implementation == VARLEN_ATTENTION
    assert model.qwen.model.visual.blocks[0].attn.config._attn_implementation == VARLEN_ATTENTION
    assert model.qwen.config.text_config._attn_implementation == "sdpa"  # the LLM keeps its own
    model.qwen.save_pretrained(tmp_path, safe_serialization=True)
    assert VARLEN_ATTENTION not in (tmp_path / "config.json").read_text()
    assert "_attn_implementation" not in json.loads((tmp_path / "config.json").read_text())["vision_config"]


def test_other_attention_choices_are_kept() -> None:
    eager = load_qwen(LanguageModelSettings(path=QWEN_DIR, random_init=True, seed=0), attn_implementation="eager")
    assert not use_varlen_vision_attention(eager)
    assert eager.config.vision_config._attn_implementation == "eager"


def test_cpu_embeddings_and_gradients_equal_transformers_sdpa() -> None:
    embeddings, grads = vit_outputs(tiny_model(trainable=TRAIN_VIT))
    expected, expected_grads = vit_outputs(sdpa_twin())
    assert torch.equal(embeddings, expected)
    assert len(grads) == len(expected_grads) and all(torch.equal(a, b) for a, b in zip(grads, expected_grads))


def test_one_packed_sequence_with_boundaries_is_required() -> None:
    q = torch.zeros(2, 2, 8, 16)
    with pytest.raises(ValueError, match="one packed sequence"):
        varlen_attention_forward(torch.nn.Module(), q, q, q, None, cu_seq_lens_q=torch.tensor([0, 8]))
    with pytest.raises(ValueError, match="cu_seq_lens_q None"):
        varlen_attention_forward(torch.nn.Module(), q[:1], q[:1], q[:1], None)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the varlen FlashAttention kernel needs CUDA")
def test_cuda_bf16_kernel_matches_float32_sdpa() -> None:
    embeddings, grads = vit_outputs(tiny_model(trainable=TRAIN_VIT), "cuda", torch.bfloat16)
    expected, expected_grads = vit_outputs(sdpa_twin(), "cuda", torch.float32)
    assert torch.allclose(embeddings, expected, rtol=0.05, atol=0.05 * expected.abs().max().item())
    for got, want in zip(grads, expected_grads):
        assert (got - want).norm() <= 0.1 * want.norm() + 1e-6
