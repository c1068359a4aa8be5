"""Training levers in one process: the ZeRO stage, the kernel switches (Liger, regional compile) as
settings and as functions (``make train`` refusing Liger without the package: tests/e2e/test_train_levers.py)."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
import torch
import yaml

from helpers.model_cases import tiny_model
from helpers.profiles import write_test_profile
from janus_core.bases import QWEN2_5_VL
from janus_core.profile import ProfileError, load_profile
from janus_train.config import deepspeed_config, load_train_settings
from janus_train.model.kernels import KernelUnavailable, apply_liger, compile_decoder_layers, liger_missing


def profile_with(tmp_path: Path, **train: object) -> Path:
    path = write_test_profile(tmp_path / "levers.yaml")
    data = yaml.safe_load(path.read_text())
    data["train"].update(train)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_zero_stage_3_is_the_default_and_2_drops_the_stage_3_settings(tmp_path: Path) -> None:
    default = deepspeed_config(load_train_settings(load_profile(profile_with(tmp_path))), bf16=False)
    assert default["zero_optimization"]["stage"] == 3
    assert default["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] is True
    zero2 = deepspeed_config(load_train_settings(load_profile(profile_with(tmp_path, zero_stage=2))), bf16=True)
    assert zero2["zero_optimization"]["stage"] == 2
    assert not [key for key in zero2["zero_optimization"] if key.startswith("stage3_")]
    assert zero2["zero_optimization"]["overlap_comm"] is True and zero2["bf16"] == {"enabled": True}


def test_another_zero_stage_is_refused_naming_the_file_and_the_choices(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match=r"levers\.yaml: setting 'train\.zero_stage' is 1; expected one of 2, 3"):
        load_train_settings(load_profile(profile_with(tmp_path, zero_stage=1)))


def test_kernel_settings_are_off_by_default_and_compile_is_a_plain_switch(tmp_path: Path) -> None:
    settings = load_train_settings(load_profile(profile_with(tmp_path)))
    assert not settings.liger_kernels and not settings.compile_layers
    assert load_train_settings(load_profile(profile_with(tmp_path, compile_layers=True))).compile_layers


@pytest.mark.skipif(liger_missing() is None, reason="liger-kernel is installed here")
def test_applying_liger_without_the_package_says_what_to_install() -> None:
    with pytest.raises(KernelUnavailable, match="pip install liger-kernel"):
        apply_liger(tiny_model().qwen)


@pytest.mark.skipif(liger_missing() is not None, reason="liger-kernel (with triton) is not installed here")
def test_liger_patches_the_norms_and_mlps_of_the_transformers_janus_accepts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every RMSNorm (decoder and ViT) and decoder MLP runs Liger's forward (wiring only: the Triton
    kernels run on a GPU), with the transformers janus pins, whose Qwen2.5-VL output class Liger 0.8.5
    imports under its old name; the rotary function transformers calls stays its own."""
    modeling_qwen2_5_vl = importlib.import_module(QWEN2_5_VL.modeling_module)
    for name in ("Qwen2_5_VLRMSNorm", "Qwen2MLP"):  # Liger patches the module's classes (undone after the test)
        monkeypatch.setattr(modeling_qwen2_5_vl, name, getattr(modeling_qwen2_5_vl, name))
    rotary = modeling_qwen2_5_vl.apply_rotary_pos_emb
    qwen = tiny_model().qwen
    apply_liger(qwen)
    text, vision = qwen.model.language_model, qwen.model.visual
    norms = [text.norm, *(n for layer in text.layers for n in (layer.input_layernorm, layer.post_attention_layernorm)),
             *(n for block in vision.blocks for n in (block.norm1, block.norm2))]
    assert {norm._get_name() for norm in norms} == {"LigerRMSNorm"}
    assert {layer.mlp._get_name() for layer in text.layers} == {"LigerSwiGLUMLP"}
    assert modeling_qwen2_5_vl.apply_rotary_pos_emb is rotary


def test_regional_compile_wraps_every_decoder_layer_and_keeps_its_output() -> None:
    """Wiring only (dynamo's eager backend): inductor's code generation takes minutes on a CPU."""
    model = tiny_model().eval()
    layers = model.qwen.model.language_model.layers
    hidden = torch.randn(1, 12, model.qwen.config.text_config.hidden_size, generator=torch.Generator().manual_seed(0))
    positions = torch.arange(12).view(1, 1, -1).expand(3, 1, -1)
    rotary = model.qwen.model.language_model.rotary_emb(hidden, positions)

    def run() -> torch.Tensor:
        with torch.no_grad():
            return layers[0](hidden, position_embeddings=rotary, position_ids=positions)

    expected = run()
    assert compile_decoder_layers(layers, backend="eager") == len(layers)
    assert all(layer._compiled_call_impl is not None for layer in layers)
    torch._dynamo.reset()
    assert torch.equal(run(), expected)
