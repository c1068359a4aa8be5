"""The FLOP table and the GPU bench for a Qwen3-VL base: Qwen3-VL-8B's architecture, its ViT (16-px
patches, no windows, learned position embeddings) and DeepStack mergers counted on the meta device
exactly as the step runs them, the table beside Qwen2.5-VL-7B's, and `make bench-gpu --base
qwen3_vl` in its CPU smoke mode on the tiny Qwen3-VL."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from unittest import mock

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from benchmarks import bench_gpu
from benchmarks.bench import flops_section
from benchmarks.bench_report import flops_by_base_markdown, flops_markdown
from janus_core.bases import QWEN3_VL
from janus_train.model.activation_checkpointing import FULL, NONE
from janus_train.model.janus_model import TrainableParts
from benchmarks.flops import (
    VIT_COMPONENTS,
    build_model,
    count_flops,
    count_step,
    merger_only,
    vit_block_flops,
    vit_flops_one_image,
)
from benchmarks.workload import SampleShape, StepRunner, make_batch

MODELS = Path(__file__).resolve().parents[2] / "configs" / "models"
TINY_QWEN3 = MODELS / "tiny-qwen3_vl"
TINY_VGGT = MODELS / "tiny-vggt.json"
SHAPE = SampleShape(side=56)  # VGGT 56 px (4x4 patches) <-> Qwen3-VL 64 px (4x4 patches, 2x2 tokens)
# Qwen3-VL-8B-Instruct's parameters (its safetensors: 8.77 B), DeepStack mergers included.
QWEN3_8B_PARAMS = 8_767_123_696


@pytest.fixture(scope="module")
def deep_tiny_qwen3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Qwen3-VL with 5 decoder layers and 4 ViT blocks tapped by DeepStack at 0 and 2, so
    extrapolating from 2 and 3 layers and from 1 and 2 blocks is actually tested."""
    folder = tmp_path_factory.mktemp("qwen3deep")
    config = json.loads((TINY_QWEN3 / "config.json").read_text())
    config["text_config"]["num_hidden_layers"] = 5
    config["vision_config"].update(depth=4, deepstack_visual_indexes=[0, 2])
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_the_8b_architecture_builds_qwen3_vl_8bs_parameters_deepstack_mergers_included() -> None:
    qwen = build_model(MODELS / "qwen3_vl_8b", 2048).qwen  # meta device: shapes only
    assert sum(p.numel() for p in qwen.parameters()) == QWEN3_8B_PARAMS
    assert len(qwen.model.visual.deepstack_merger_list) == 3 and len(qwen.model.visual.blocks) == 27


def test_a_qwen3_sample_has_qwen3_frames_vggt_frames_and_the_same_visual_tokens() -> None:
    model = build_model(TINY_QWEN3, 128, merger_hidden=96)
    batch = make_batch(model, SHAPE)
    assert SHAPE.frame_side(QWEN3_VL) == 64 and SampleShape().frame_side(QWEN3_VL) == 736
    assert tuple(batch["frames"].shape) == (1, 9, 64, 64, 3)  # the base's own resolution
    assert tuple(batch["vggt_frames"].shape) == (1, 9, 56, 56, 3)  # what the reference's VGGT sees
    assert tuple(batch["features"].shape) == (1, 16, 128)  # 4x4 VGGT patches, 2x2 grouped = 2x2 tokens
    assert int((batch["input_ids"] == model.image_token_id).sum()) == 9 * SHAPE.visual_tokens == 9 * 4
    # With the ViT cache a frame brings its last block's output and each DeepStack merger's input.
    cached = make_batch(model, SHAPE, vit_cache=True)["vit_features"]
    visual = model.qwen.model.visual
    levels = 1 + len(visual.deepstack_merger_list)
    assert tuple(cached.shape) == (1, 9, levels, 4 * 4, visual.config.hidden_size)


def test_the_janus_step_feeds_deepstack_to_the_llm_and_trains_the_deepstack_mergers() -> None:
    model = build_model(TINY_QWEN3, 128, merger_hidden=96, device=torch.device("cpu"), dtype=torch.float32)
    model.train()
    batch = make_batch(model, SHAPE)
    runner = StepRunner(model)
    loss = runner.loss("janus", batch)
    loss.backward()
    for merger in model.qwen.model.visual.deepstack_merger_list:
        assert merger.linear_fc2.weight.grad is not None and merger.linear_fc2.weight.grad.abs().sum() > 0
    assert all(p.grad is None for p in model.qwen.model.visual.blocks.parameters())  # frozen
    model.zero_grad(set_to_none=True)
    # Without the DeepStack embeddings the LLM computes another loss: they do reach it.
    with mock.patch.object(type(model.qwen.model.language_model), "_deepstack_process",
                           lambda self, hidden, masks, embeds: hidden):
        assert float(runner.loss("janus", batch).detach()) != pytest.approx(float(loss.detach()), rel=1e-6)


def test_flop_table_extrapolation_equals_counting_the_whole_qwen3_model(deep_tiny_qwen3: Path) -> None:
    table = count_flops(deep_tiny_qwen3, TINY_VGGT, SHAPE, FULL, merger_hidden=96)
    model = build_model(deep_tiny_qwen3, 128, merger_hidden=96)
    runner = StepRunner(model, vit=merger_only, reference_vggt=lambda f: torch.empty(1, 16, 128, device="meta"))
    direct = count_step(runner, "janus", make_batch(model, SHAPE), FULL)
    for name in ("llm_forward", "logits", "backward", "recompute", "merger"):
        assert table.janus.components[name] == pytest.approx(direct[name], rel=1e-9), name
    vit, vit_direct = vit_block_flops(deep_tiny_qwen3, SHAPE, FULL), vit_flops_one_image(model, SHAPE) * SHAPE.images
    assert vit.forward == pytest.approx(vit_direct.forward, rel=1e-9) and vit.forward > 0
    assert vit.backward == vit_direct.backward == 0  # frozen blocks record no graph
    trains = TrainableParts(vision_tower=True)
    trained = vit_block_flops(deep_tiny_qwen3, SHAPE, trainable=trains)
    direct_trained = vit_flops_one_image(build_model(deep_tiny_qwen3, 128, merger_hidden=96, trainable=trains), SHAPE)
    assert trained.backward == pytest.approx(direct_trained.backward * SHAPE.images, rel=1e-9)
    # A trained tower does run in the backward (weight gradients everywhere, input gradients above
    # the patch embedding, whose wide convolution dominates the tiny tower).
    assert trained.backward > trained.forward == pytest.approx(vit.forward, rel=1e-9)


def test_the_meta_device_counts_the_step_the_cpu_runs(deep_tiny_qwen3: Path) -> None:
    """On the meta device DeepStack's boolean-mask addition is replaced (a mask has no values there);
    the counted FLOPs are those of the real step on the CPU."""
    counted = {}
    for device in ("meta", "cpu"):
        # Eager attention: PyTorch's counter does not count the CPU's fused SDPA kernel.
        model = build_model(deep_tiny_qwen3, 128, merger_hidden=96, device=torch.device(device), dtype=torch.float32,
                            attn_implementation="eager")
        runner = StepRunner(model, vit=merger_only, reference_vggt=lambda f: torch.zeros(1, 16, 128, device=f.device))
        counted[device] = count_step(runner, "janus", make_batch(model, SHAPE), FULL)
    assert counted["meta"] == counted["cpu"]


def test_the_deepstack_mergers_count_in_the_merger_row(deep_tiny_qwen3: Path) -> None:
    without = deep_tiny_qwen3.parent / "qwen3-no-deepstack"
    without.mkdir(exist_ok=True)
    config = json.loads((deep_tiny_qwen3 / "config.json").read_text())
    config["vision_config"]["deepstack_visual_indexes"] = []
    (without / "config.json").write_text(json.dumps(config))
    tapped = count_flops(deep_tiny_qwen3, TINY_VGGT, SHAPE, NONE, merger_hidden=96).janus.components
    plain = count_flops(without, TINY_VGGT, SHAPE, NONE, merger_hidden=96).janus.components
    visual = build_model(deep_tiny_qwen3, 128, merger_hidden=96).qwen.model.visual
    hidden = torch.empty(SHAPE.images * 16, visual.config.hidden_size, device="meta")
    with FlopCounterMode(display=False) as counter:
        for merger in visual.deepstack_merger_list:
            merger(hidden)
    assert counter.get_total_flops() > 0
    assert tapped["merger"] - plain["merger"] == pytest.approx(counter.get_total_flops(), rel=1e-9)
    assert tapped["vit"] == plain["vit"]  # the blocks cost the same, tapped or not
    assert tapped["backward"] > plain["backward"]  # the DeepStack mergers train


def test_qwen3s_table_has_a_vit_cache_column_and_sits_beside_qwen2_5s(deep_tiny_qwen3: Path) -> None:
    tiny = {base: replace(settings, shape=SHAPE, merger_hidden=96)
            for base, settings in bench_gpu.SMOKE_BY_BASE.items()}
    tiny["qwen3_vl"] = replace(tiny["qwen3_vl"], qwen_dir=deep_tiny_qwen3)
    with mock.patch.dict(bench_gpu.REAL_BY_BASE, tiny):
        tables = flops_section()
    assert list(tables) == ["tiny-qwen2_5_vl", deep_tiny_qwen3.name]
    qwen3 = tables[deep_tiny_qwen3.name]
    assert qwen3["base"] == "Qwen3-VL"
    # The ViT cache covers Qwen3-VL: its blocks leave the step, every merger (DeepStack's too) stays.
    vit = sum(v for k, v in qwen3["janus"].items() if k in VIT_COMPONENTS)
    assert vit > 0 and qwen3["janus_vit_cache_total"] == pytest.approx(qwen3["janus_total"] - vit, rel=1e-12)
    assert qwen3["janus_vit_cache"]["merger"] == qwen3["janus"]["merger"] > 0
    assert qwen3["shape"]["qwen_side"] == 64 and qwen3["shape"]["side"] == 56
    assert tables["tiny-qwen2_5_vl"]["janus_vit_cache"] is not None
    single = flops_markdown(qwen3)
    assert "janus + ViT cache" in single and "does not cover" not in single
    assert "9 images of 64² (VGGT at 56²)" in single
    side_by_side = flops_by_base_markdown(tables)
    assert f"| {deep_tiny_qwen3.name} janus | {deep_tiny_qwen3.name} reference |" in side_by_side
    assert "tiny-qwen2_5_vl janus | tiny-qwen2_5_vl reference" in side_by_side
    total = f"**{qwen3['janus_total'] / 1e12:.1f}** | **{qwen3['reference_total'] / 1e12:.1f}**"
    assert side_by_side.count("| **total** |") == 1 and total in side_by_side


def test_gpu_bench_smoke_mode_measures_the_qwen3_step_and_says_which_levers_do_not_apply(tmp_path: Path) -> None:
    bench_gpu.command(out=tmp_path, smoke=True, base="qwen3_vl", data=False)
    results = json.loads((tmp_path / "gpu_smoke_qwen3_vl.json").read_text())
    assert results["models"]["qwen"] == "tiny-qwen3_vl" and results["flops"]["base"] == "Qwen3-VL"
    rows = results["training"]["rows"]
    lever = results["training"]["lever_checkpointing"]
    for name in ("janus_full", "janus_none", "janus_every_2", "reference_full"):
        assert rows[name]["s_per_sample"]["min"] > 0 and rows[name]["tokens_per_s"] > 0, name
    cached = rows[f"janus_{lever}_vit_cache"]  # measured: the frozen blocks' output comes from the batch
    assert cached["levers"] == ["vit_cache"] and cached["s_per_sample"]["min"] > 0
    assert "pixel_values" not in cached["phases_s"]
    assert "Liger's Qwen2.5-VL kernels only" in rows[f"janus_{lever}_liger"]["error"]
    assert rows["janus_full"]["loss"] == pytest.approx(rows["janus_none"]["loss"], rel=1e-5)
    assert "vggt" in rows["reference_full"]["phases_s"] and "pixel_values" in rows["janus_full"]["phases_s"]
    table = (tmp_path / "gpu_smoke_qwen3_vl.md").read_text()
    assert "tiny-qwen3_vl" in table and "| janus + ViT cache |" in table
    assert (tmp_path / "gpu_smoke_qwen3_vl_flops.png").stat().st_size > 0
    assert not (tmp_path / "gpu_smoke.json").exists()  # Qwen2.5-VL's results keep their own names
