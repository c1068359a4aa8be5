"""The GPU bench instrument: real-architecture configs, FLOP counts on the meta device, the
activation-checkpointing setting, the projection, and the whole bench in its CPU smoke mode; for
a Qwen3-VL base too: Qwen3-VL-8B's architecture, its ViT (16-px patches, no windows, learned
position embeddings) and DeepStack mergers counted on the meta device exactly as the step runs
them, the table beside Qwen2.5-VL-7B's, and `make bench-gpu --base qwen3_vl` in its CPU smoke mode on
the tiny Qwen3-VL."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from unittest import mock

import pytest
import torch
import yaml
from PIL import Image
from torch.utils.flop_counter import FlopCounterMode
from transformers import Qwen2_5_VLConfig

import benchmarks.flops
from benchmarks import bench_gpu
from benchmarks.bench_run import flops_section
from benchmarks.bench_projection import (
    REFERENCE_GPU_S_PER_SAMPLE,
    REFERENCE_HOURS_PER_EPOCH,
    DeviceSpec,
    device_spec,
    project,
    zero3_bytes_per_sample,
    zero_options,
)
from benchmarks.bench_report import flops_by_base_markdown, flops_markdown
from benchmarks.flops import (
    VIT_COMPONENTS,
    FlopTable,
    build_model,
    build_vggt,
    count_flops,
    count_step,
    load_vggt_config,
    merger_only,
    vggt_stream_flops,
    vit_block_flops,
    vit_flops_one_image,
)
from benchmarks.workload import SampleShape, StepRunner, make_batch, stream_window_features
from helpers.bases import QWEN2_5, QWEN3, BaseCase
from janus_core.bases import QWEN3_VL
from janus_core.profile import PROFILES_DIR, ProfileError, load_profile
from janus_train.config import load_train_settings
from janus_train.model.activation_checkpointing import FULL, NONE, ActivationCheckpointing
from janus_train.model.janus_model import TrainableParts

MODELS = Path(__file__).resolve().parents[2] / "configs" / "models"
TINY_QWEN = QWEN2_5.qwen_dir
TINY_QWEN3 = QWEN3.qwen_dir
TINY_VGGT = MODELS / "tiny-vggt.json"
SHAPE = SampleShape(side=56)  # VGGT 56 px (4x4 patches) <-> Qwen3-VL 64 px (4x4 patches, 2x2 tokens)
# VGGT-1B's aggregator checkpoint (facebook/VGGT-1B): 1210 tensors, 909,112,320 parameters.
VGGT_1B_KEYS, VGGT_1B_PARAMS = 1210, 909_112_320
# Qwen2.5-VL-7B-Instruct: 8,292,166,656 parameters (LLM, lm_head, ViT and its merger).
QWEN_7B_PARAMS = 8_292_166_656


# ------------------------------------------------------------------------------ configs


def test_qwen_7b_config_has_the_real_architecture_under_transformers_names() -> None:
    config = Qwen2_5_VLConfig.from_pretrained(MODELS / "qwen2_5_vl_7b")
    text, vision = config.text_config, config.vision_config
    assert (text.hidden_size, text.num_hidden_layers, text.num_attention_heads, text.num_key_value_heads) == (3584, 28, 28, 4)
    assert (text.intermediate_size, text.vocab_size) == (18944, 152064)
    assert text.rope_parameters["rope_theta"] == 1e6 and text.rope_parameters["mrope_section"] == [16, 24, 24]
    assert (vision.depth, vision.hidden_size, vision.num_heads, vision.intermediate_size) == (32, 1280, 16, 3420)
    assert (vision.patch_size, vision.spatial_merge_size, vision.temporal_patch_size, vision.window_size) == (14, 2, 2, 112)
    assert vision.fullatt_block_indexes == [7, 15, 23, 31] and vision.out_hidden_size == 3584
    qwen = build_model(MODELS / "qwen2_5_vl_7b", 2048).qwen  # meta device: shapes only
    assert sum(p.numel() for p in qwen.parameters()) == QWEN_7B_PARAMS


def test_vggt_1b_config_builds_the_checkpoints_keys_and_parameters() -> None:
    state = build_vggt(load_vggt_config(MODELS / "vggt_1b.json")).state_dict()
    assert len(state) == VGGT_1B_KEYS
    assert sum(t.numel() for t in state.values()) == VGGT_1B_PARAMS


# ---------------------------------------------------------------- activation checkpointing


@pytest.mark.parametrize(
    ("value", "every", "text"),
    [("full", 1, "full"), ("none", 0, "none"), ("every_2", 2, "every_2"), ("every_12", 12, "every_12"),
     (True, 1, "full"), (False, 0, "none")],
)
def test_checkpointing_policy_parses_the_profile_values(value: object, every: int, text: str) -> None:
    policy = ActivationCheckpointing.parse(value)
    assert policy.every == every and str(policy) == text


@pytest.mark.parametrize("value", ["every_0", "every_", "some", "Full", 2, None])
def test_checkpointing_policy_rejects_other_values(value: object) -> None:
    with pytest.raises(ValueError, match="expected full, none or every_K"):
        ActivationCheckpointing.parse(value)


def _tiny_profile(tmp_path: Path, checkpointing: object) -> Path:
    data = yaml.safe_load((PROFILES_DIR / "tiny.yaml").read_text())
    data["vggt"] = {"config": str(PROFILES_DIR / data["vggt"]["config"]), "seed": 0}
    data["qwen"] = dict(data["qwen"], path=str(PROFILES_DIR / data["qwen"]["path"]))
    data["train"]["gradient_checkpointing"] = checkpointing
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_profile_setting_gives_the_policy_and_names_a_wrong_value(tmp_path: Path) -> None:
    settings = load_train_settings(load_profile(_tiny_profile(tmp_path, "every_2")))
    assert settings.gradient_checkpointing == ActivationCheckpointing(2)
    assert load_train_settings(load_profile(_tiny_profile(tmp_path, True))).gradient_checkpointing == FULL
    with pytest.raises(ProfileError, match=r"p\.yaml: setting 'train\.gradient_checkpointing': expected full, none"):
        load_train_settings(load_profile(_tiny_profile(tmp_path, "every_layer")))


def test_every_k_checkpoints_every_kth_decoder_layer_and_keeps_the_gradients() -> None:
    """Recomputation changes memory and time, never the loss or the gradients."""
    config = json.loads((TINY_QWEN / "config.json").read_text())
    config["text_config"]["num_hidden_layers"] = 4
    model = build_model(Qwen2_5_VLConfig.from_dict(config), 128, merger_hidden=96, device=torch.device("cpu"),
                        dtype=torch.float32)
    model.train()
    batch = make_batch(model, SHAPE)
    runner = StepRunner(model)
    grads = {}
    for policy in (NONE, ActivationCheckpointing(2), FULL):
        model.set_gradient_checkpointing(policy)
        layers = model.qwen.model.language_model.layers
        assert [layer.gradient_checkpointing for layer in layers] == [
            policy.enabled and i % policy.every == 0 for i in range(len(layers))
        ]
        loss = runner.loss("janus", batch)
        loss.backward()
        grads[str(policy)] = (float(loss.detach()), model.qwen.lm_head.weight.grad.clone())
        model.zero_grad(set_to_none=True)
    for name in ("every_2", "full"):
        assert grads[name][0] == pytest.approx(grads["none"][0], rel=1e-6)
        torch.testing.assert_close(grads[name][1], grads["none"][1], rtol=1e-5, atol=1e-7)


# ------------------------------------------------------------------------------- FLOPs


def write_deep_tiny(base: BaseCase, folder: Path) -> Path:
    """The tiny model of ``base`` with 5 decoder layers and 4 ViT blocks (Qwen2.5-VL: 2 of them
    full-attention; Qwen3-VL: tapped by DeepStack at 0 and 2), so extrapolating from 2 and 3 layers
    and from 1 and 2 blocks is actually tested."""
    config = json.loads((base.qwen_dir / "config.json").read_text())
    config["text_config"]["num_hidden_layers"] = 5
    taps = {"deepstack_visual_indexes": [0, 2]} if base.base.deepstack else {"fullatt_block_indexes": [1, 3]}
    config["vision_config"].update(depth=4, **taps)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.fixture(scope="module")
def deep_tiny_qwen(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_deep_tiny(QWEN2_5, tmp_path_factory.mktemp("qwen5"))


@pytest.fixture(scope="module")
def deep_tiny_qwen3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_deep_tiny(QWEN3, tmp_path_factory.mktemp("qwen3deep"))


@pytest.fixture(scope="module")
def deep_tiny(base: BaseCase, request: pytest.FixtureRequest) -> Path:
    """The base's deep tiny model (``deep_tiny_qwen``, ``deep_tiny_qwen3``)."""
    return request.getfixturevalue("deep_tiny_qwen3" if base is QWEN3 else "deep_tiny_qwen")


@pytest.fixture(scope="module")
def flop_tables() -> Callable[[Path, ActivationCheckpointing], FlopTable]:
    """A model's FLOP table under a checkpointing policy, counted once per module (each count takes seconds)."""
    return functools.cache(lambda qwen_dir, policy: count_flops(qwen_dir, TINY_VGGT, SHAPE, policy, merger_hidden=96))


@pytest.fixture(scope="module")
def full_table(deep_tiny_qwen: Path, flop_tables: Callable[[Path, ActivationCheckpointing], FlopTable]) -> FlopTable:
    """``deep_tiny_qwen``'s FLOP table under full checkpointing."""
    return flop_tables(deep_tiny_qwen, FULL)


def test_flop_table_extrapolation_equals_counting_the_whole_model(
    base: BaseCase, deep_tiny: Path, flop_tables: Callable[[Path, ActivationCheckpointing], FlopTable],
) -> None:
    """On each base: Qwen2.5-VL's window and full-attention ViT blocks, Qwen3-VL's (16-px patches, no
    windows, learned position embeddings) tapped by DeepStack."""
    table = flop_tables(deep_tiny, FULL)
    model = build_model(deep_tiny, 128, merger_hidden=96)
    runner = StepRunner(model, vit=merger_only, reference_vggt=lambda f: torch.empty(1, 16, 128, device="meta"))
    direct = count_step(runner, "janus", make_batch(model, SHAPE), FULL)
    for name in ("llm_forward", "logits", "backward", "recompute", "merger"):
        assert table.janus.components[name] == pytest.approx(direct[name], rel=1e-9), name
    vit, vit_direct = vit_block_flops(deep_tiny, SHAPE, FULL), vit_flops_one_image(model, SHAPE) * SHAPE.images
    assert vit.forward == pytest.approx(vit_direct.forward, rel=1e-9) and vit.forward > 0
    assert vit.backward == vit_direct.backward == 0  # frozen: outside autograd, no graph recorded
    # A trained vision tower does run in the backward: input and weight gradients, ~2x its forward on
    # Qwen2.5-VL (Qwen3-VL's tiny tower: no input gradient into its wide patch embedding, which dominates).
    trains = TrainableParts(vision_tower=True)
    trained = vit_block_flops(deep_tiny, SHAPE, trainable=trains)
    direct = vit_flops_one_image(build_model(deep_tiny, 128, merger_hidden=96, trainable=trains), SHAPE)
    assert trained.backward == pytest.approx(direct.backward * SHAPE.images, rel=1e-9)
    assert trained.backward > (1.5 if base is QWEN2_5 else 1.0) * trained.forward
    assert trained.forward == pytest.approx(vit.forward, rel=1e-9)


def test_the_vggt_stream_is_counted_as_the_references_loop_runs() -> None:
    config = load_vggt_config(TINY_VGGT)
    frames = torch.empty(1, SHAPE.images, SHAPE.side, SHAPE.side, 3, dtype=torch.uint8, device="meta")
    with FlopCounterMode(display=False) as counter:
        stream_window_features(build_vggt(config), frames)
    assert vggt_stream_flops(config, SHAPE) == pytest.approx(counter.get_total_flops(), rel=1e-9)


def test_flop_table_of_janus_and_reference_steps(
    deep_tiny_qwen: Path, full_table: FlopTable, flop_tables: Callable[[Path, ActivationCheckpointing], FlopTable],
) -> None:
    none = flop_tables(deep_tiny_qwen, NONE)
    janus, reference = full_table.janus.components, full_table.reference.components
    assert janus["vggt"] == 0 and reference["vggt"] > 0  # janus's VGGT ran in precompute
    assert janus["vit"] == reference["vit"] > 0 and janus["llm_forward"] == reference["llm_forward"] > 0
    # The frozen ViT runs nothing in the backward, under any policy.
    assert janus["vit_backward"] == none.janus.components["vit_backward"] == reference["vit_backward"] == 0
    # With the ViT cache its blocks do not run at all; its patch merger still does.
    cached = full_table.janus_vit_cache.components
    assert cached["vit"] == cached["vit_backward"] == 0 and cached["merger"] == janus["merger"] > 0
    assert full_table.janus_vit_cache.total == pytest.approx(full_table.janus.total - janus["vit"], rel=1e-12)
    # Every one of the 354 positions vs the 100 answer rows (+ the action head in both).
    assert reference["logits"] > 3 * janus["logits"] > 0
    assert janus["recompute"] > 0 and none.janus.components["recompute"] == 0
    assert none.janus.components["backward"] == pytest.approx(janus["backward"], rel=1e-9)
    assert full_table.ratio == pytest.approx(full_table.reference.total / full_table.janus.total)
    assert full_table.ratio > 1
    assert full_table.janus.model_flops == pytest.approx(full_table.janus.total - janus["recompute"])
    with pytest.raises(ValueError, match="full or no checkpointing"):
        count_flops(deep_tiny_qwen, TINY_VGGT, SHAPE, ActivationCheckpointing(2))


def test_the_flop_counter_shows_a_frozen_vit_pulled_into_the_backward() -> None:
    """What the counter would have shown before the fix: the ViT as one call of the whole tower, with
    checkpointing through transformers' own enabling (which hooks the ViT's patch_embed)."""
    model = build_model(TINY_QWEN, 128, merger_hidden=96)
    model.qwen.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    with mock.patch.object(benchmarks.flops, "vit_embeddings",
                           lambda visual, pixel_values, grid, **layout: visual(pixel_values, grid, **layout).pooler_output):
        before = vit_flops_one_image(model, SHAPE)
    model.set_gradient_checkpointing(FULL)
    after = vit_flops_one_image(model, SHAPE)
    assert before.backward > 0.5 * before.forward > 0  # input gradients through every block
    assert after.backward == 0 and after.forward == pytest.approx(before.forward, rel=1e-12)


# --------------------------------------------------------------------------- projection


def test_projection_reproduces_the_reference_epoch_and_adds_zero3_traffic() -> None:
    spec = DeviceSpec("test", 1000.0, 100.0)
    # Without traffic, 6.9 GPU-s per sample is the reference's measured epoch on 8 GPUs.
    assert project(spec, REFERENCE_GPU_S_PER_SAMPLE, 0, 0).hours_per_epoch_no_overlap == pytest.approx(
        REFERENCE_HOURS_PER_EPOCH, rel=0.01)
    # 8e9 parameters, 7e9 trainable: (8 + 14) e9 x 2 bytes x 7/8 = 38.5 GB per sample, 0.385 s at 100 GB/s.
    assert zero3_bytes_per_sample(8_000_000_000, 7_000_000_000) == pytest.approx(38.5e9)
    p = project(spec, 0.5, 8_000_000_000, 7_000_000_000)
    assert p.comm_s_per_sample == pytest.approx(0.385)
    assert p.gpu_s_per_sample_no_overlap == pytest.approx(0.885) and p.gpu_s_per_sample_full_overlap == 0.5
    assert p.hours_per_epoch_full_overlap == pytest.approx(612_492 * 0.5 / 8 / 3600)
    assert device_spec("NVIDIA H100 80GB HBM3").name == "H100 SXM" and device_spec("cpu") is None


def test_zero_stage_projection_trades_weights_per_gpu_for_traffic_on_one_node_and_several() -> None:
    spec = DeviceSpec("test", 1000.0, 400.0)
    params, trainable = 8_000_000_000, 7_000_000_000
    options = {(o.stage, o.nodes): o for o in zero_options(spec, 0.5, params, trainable)}
    assert set(options) == {(stage, nodes) for stage in (2, 3) for nodes in (1, 2, 4)}
    # ZeRO-3: (8 + 14) e9 x 2 bytes x 7/8 = 38.5 GB per sample; ZeRO-2: 7e9 x 2 x 7/8 x (1 + 1/8 steps).
    assert options[3, 1].comm_gb_per_sample == pytest.approx(38.5)
    assert options[2, 1].comm_gb_per_sample == pytest.approx(7 * 2 * 7 / 8 * 9 / 8)
    # State per GPU: ZeRO-3 shards all of (16 + 14 + 84) GB; ZeRO-2 keeps the 16 GB of weights whole.
    assert options[3, 1].state_gib_per_gpu * 2**30 == pytest.approx(114e9 / 8)
    assert options[2, 1].state_gib_per_gpu * 2**30 == pytest.approx(16e9 + 98e9 / 8)
    # Inside a node the ring runs at NVLink, across nodes at the NIC (50 GB/s per GPU).
    assert options[3, 1].comm_s_per_sample == pytest.approx(38.5 / 400)
    assert options[3, 4].comm_s_per_sample == pytest.approx(zero3_bytes_per_sample(params, trainable, 32) / 50e9)
    assert options[2, 4].hours_per_epoch_no_overlap < options[3, 4].hours_per_epoch_no_overlap
    assert options[3, 4].gpu_s_per_sample_full_overlap == max(0.5, options[3, 4].comm_s_per_sample)


# ---------------------------------------------------------------------------- smoke run


def test_gpu_bench_smoke_mode_runs_every_section_and_writes_table_and_plots(tmp_path: Path) -> None:
    bench_gpu.command(out=tmp_path, smoke=True, profile=True)
    results = json.loads((tmp_path / "gpu_smoke.json").read_text())
    pre, train = results["precompute"], results["training"]
    assert set(pre["rows"]) == {"janus_b1", "janus_b2", "reference_b1"}
    assert all(row["windows_per_s"]["median"] > 0 for row in pre["rows"].values())
    # Each VGGT lever alone (compile only on CUDA): today's path, dedup, each CPU kernel.
    levers = pre["levers"]["rows"]
    assert set(levers) == {"baseline", "dedup", "kernel=sdpa-flash", "kernel=sdpa-math"}
    assert all(row["windows_per_s"]["median"] > 0 for row in levers.values())
    assert levers["baseline"]["kernel"] == "sdpa" and levers["kernel=sdpa-math"]["kernel"] == "sdpa-math"
    assert pre["levers"]["distinct_frames_per_window"] < 9
    rows = train["rows"]
    # Each policy, then each lever on the fastest policy (compile rows only with a GPU: minutes on a CPU).
    lever = train["lever_checkpointing"]
    assert lever in ("full", "none", "every_2")
    assert set(rows) == {"janus_full", "janus_none", "janus_every_2", "reference_full", f"janus_{lever}_vit_cache",
                         f"janus_{lever}_liger"}
    measured = {name: r for name, r in rows.items() if "s_per_sample" in r}
    assert all(r["s_per_sample"]["min"] > 0 and r["tokens_per_s"] > 0 for r in measured.values())
    # Liger is optional: without the package its row says so instead of failing the bench.
    if train["liger"].startswith("the liger-kernel package is not installed"):
        assert "liger-kernel" in rows[f"janus_{lever}_liger"]["error"]
    # Every row on a fresh model with the same weights and sample: the checkpointing policy leaves the
    # loss as it is.
    assert rows["janus_every_2"]["loss"] == pytest.approx(rows["janus_none"]["loss"], rel=1e-5)
    assert rows["janus_full"]["loss"] == pytest.approx(rows["janus_none"]["loss"], rel=1e-5)
    # The ViT cache row builds no pixel values and runs only the ViT's patch merger.
    cached = rows[f"janus_{lever}_vit_cache"]
    assert cached["levers"] == ["vit_cache"] and "pixel_values" not in cached["phases_s"]
    assert "pixel_values" in rows[f"janus_{lever}"]["phases_s"]
    # --profile: a loadable trace and the top operators of one step.
    profile = results["profile"]
    trace = json.loads((tmp_path / "gpu_smoke_profile_trace.json").read_text())
    assert profile["trace"] == "gpu_smoke_profile_trace.json" and trace["traceEvents"]
    assert len(profile["top_ops"]) > 5 and all(op["self_ms"] >= 0 and op["calls"] > 0 for op in profile["top_ops"])
    assert any("mm" in op["op"] for op in profile["top_ops"])
    assert "vggt" in rows["reference_full"]["phases_s"] and "vggt" not in rows["janus_full"]["phases_s"]
    assert train["ratio_best"] > 0 and train["liger"]
    assert results["flops"]["ratio"] > 1
    table = (tmp_path / "gpu_smoke.md").read_text()
    assert "janus_every_2" in table and "reference_full" in table and "Reference / janus FLOPs per step" in table
    assert "Top operators of one janus step" in table and "| janus + ViT cache |" in table
    assert "| VGGT lever, B=4 overlapping windows" in table and "| kernel=sdpa-math |" in table
    for plot in ("gpu_smoke_step_breakdown.png", "gpu_smoke_flops.png"):
        with Image.open(tmp_path / plot) as image:
            assert image.size[0] > 500


# ------------------------------------------------------------------------------- Qwen3-VL


# Qwen3-VL-8B-Instruct's parameters (its safetensors: 8.77 B), DeepStack mergers included.
QWEN3_8B_PARAMS = 8_767_123_696


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


def test_the_deepstack_mergers_count_in_the_merger_row(
    deep_tiny_qwen3: Path, flop_tables: Callable[[Path, ActivationCheckpointing], FlopTable],
) -> None:
    without = deep_tiny_qwen3.parent / "qwen3-no-deepstack"
    without.mkdir(exist_ok=True)
    config = json.loads((deep_tiny_qwen3 / "config.json").read_text())
    config["vision_config"]["deepstack_visual_indexes"] = []
    (without / "config.json").write_text(json.dumps(config))
    tapped = flop_tables(deep_tiny_qwen3, NONE).janus.components
    plain = flop_tables(without, NONE).janus.components
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


# ------------------------------------------------------------------------ rows of the device run


def test_a_micro_batch_stacks_samples_on_the_batch_dimension_and_steps_per_sample() -> None:
    model = build_model(TINY_QWEN, 128, merger_hidden=96, device=torch.device("cpu"), dtype=torch.float32)
    one, four = make_batch(model, SHAPE), bench_gpu.micro_batch(model, SHAPE, 4, vit_cache=True)
    assert four["input_ids"].shape == (4, one["input_ids"].shape[1]) and four["frames"].shape[0] == 4
    assert four["position_ids"].shape == (3, 4, one["input_ids"].shape[1])  # M-RoPE positions: [3, B, L]
    assert four["vit_features"].shape[0] == 4 and four["action_positions"].shape == (4,)
    assert torch.equal(four["input_ids"][0], one["input_ids"][0])  # sample 0 is make_batch's own
    assert not torch.equal(four["frames"][0], four["frames"][1])  # the others are other samples
    model.train()
    assert StepRunner(model).step("janus", four) > 0  # one micro-batch of four through the janus step


def test_a_liger_row_leaves_transformers_qwen2_5_vl_module_as_it_found_it() -> None:
    module = bench_gpu.liger_patched_module()
    assert module.__name__.endswith("modeling_qwen2_5_vl")
    before = dict(vars(module))
    with bench_gpu.module_globals_kept(module):
        module.Qwen2MLP = object  # what Liger's patch does (and adds names)
        module.apply_multimodal_rotary_pos_emb = None
        module.LigerAddedName = 1
    assert dict(vars(module)) == before


def test_a_measured_step_row_gives_per_sample_figures_and_the_memory_before_its_step() -> None:
    settings = bench_gpu.SMOKE
    row = bench_gpu.measure_step(settings, bench_gpu.Device("cpu"), None, bench_gpu.StepRow("janus", "full", micro_batch=2),
                                 repeats=1, warmup=0)
    assert row["micro_batch"] == 2 and row["s_per_sample"]["median"] > 0 and row["tflop_per_s"] is None
    assert row["base"] == "qwen2_5_vl" and row["peak_gib"] is None and row["resident_gib"] is None  # no CUDA here
    with pytest.raises(bench_gpu.Unavailable, match="Liger's Qwen2.5-VL kernels only"):
        bench_gpu.measure_step(bench_gpu.SMOKE_BY_BASE["qwen3_vl"], bench_gpu.Device("cpu"), None,
                               bench_gpu.StepRow("janus", "full", bench_gpu.Levers(liger=True)))
