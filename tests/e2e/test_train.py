"""Stage 2: training under DeepSpeed ZeRO-3 on the CPU, tiny profile, 2 processes (the reference
run: a real torchrun launch; the others: forked ranks, helpers.training.train_on_ranks).

The data (helpers.shared_runs, shared by the session): 2 episodes x 4 steps of sample data = 8
samples, precomputed into two real zarr caches, one with float32 features (the reference run
trains on it, so the live run can be held to it tightly) and one with the tiny profile's default
bfloat16 features.

The reference run (one torchrun launch shared by the session): micro-batch 1, gradient
accumulation 2, 2 processes, so one optimizer step takes 4 samples and an epoch is 2 steps;
10 steps with a checkpoint every 3 (step 3 ends mid-epoch), the final model's outputs recorded
on two samples, and the end-of-run export. What needs no process of its own (cached vs live
inputs, micro-batches, the start-up check) is tests/unit/test_train_inputs.py.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from helpers.shared_runs import ReferenceRun, TinyTraining
from helpers.training import (
    LR,
    MAX_STEPS,
    N_PROC,
    SAVE_EVERY,
    assert_succeeded,
    read_metrics,
    train_on_ranks,
    write_train_profile,
)
from janus_core.resolution import Resolution, visual_tokens
from janus_train.build import prompt_builder
from janus_train.checkpoint.export import HEADS_FILE, load_exported
from janus_train.data.from_profile import open_training_cache
from janus_train.data.mixture import Mixture
from janus_train.data.prompt import SEGMENT_NAMES
from janus_train.data.samples import CachedSamples, collate
from janus_train.loop.parts import LRSchedule
from janus_train.loop.trainer import answer_logits
from janus_train.model.janus_model import JanusVLNModel
from janus_train.model.loss import LossDenominators, micro_batch_loss
from janus_train.run.layout import CHECKPOINTS_DIR, EXPORT_DIR, METRICS_FILE
from pipelines.distributed import usable_cores


@pytest.fixture
def setup(tiny_training: TinyTraining) -> TinyTraining:
    """The session's 8-sample data and its float32 and bfloat16 caches."""
    return tiny_training


# ----------------------------------------------------------------------------------------------
# training


def test_two_process_zero3_run_overfits_a_small_set(reference_run: ReferenceRun) -> None:
    """Ten steps over 8 samples (5 epochs) at a high LR: the loss falls clearly."""
    records = reference_run.records
    assert [r["step"] for r in records] == list(range(1, MAX_STEPS + 1))
    first = sum(r["loss"] for r in records[:2]) / 2
    last = sum(r["loss"] for r in records[-2:]) / 2
    assert last < first - 0.5, f"loss went from {first:.3f} to {last:.3f}"
    # The token loss starts near ln(vocab) of the random model and falls.
    assert records[-1]["token_loss"] < records[0]["token_loss"] - 0.5
    assert all(math.isfinite(r["loss"]) and math.isfinite(r["grad_norm"]) for r in records)


def test_a_zero2_run_trains_what_the_zero3_run_trains(setup: TinyTraining, reference_run: ReferenceRun, tmp_path: Path) -> None:
    """``train.zero_stage: 2``: 2 processes under DeepSpeed ZeRO-2 take the ZeRO-3 run's first steps
    (same data order and seed): the stage moves state and traffic, not what trains. Its checkpoint
    has ZeRO-2's layout (one whole model file) and its end-of-run export is consolidated."""
    profile = write_train_profile(tmp_path / "zero2.yaml", cache={"feature_dtype": "float32"},
                                  train={"zero_stage": 2, "max_steps": 2})
    out = tmp_path / "run"
    assert_succeeded(train_on_ranks("--out", out, "--cache", setup.fp32_cache, "--profile", profile))
    records = read_metrics(out)
    assert [r["step"] for r in records] == [1, 2]
    for zero2, zero3 in zip(records, reference_run.records[:2], strict=True):
        assert zero2["loss"] == pytest.approx(zero3["loss"], rel=1e-5)
        assert zero2["grad_norm"] == pytest.approx(zero3["grad_norm"], rel=1e-4)
    latest = out / CHECKPOINTS_DIR / (out / CHECKPOINTS_DIR / "latest").read_text().strip()
    assert (latest / "mp_rank_00_model_states.pt").is_file()  # ZeRO-3 writes one model file per rank
    assert (out / EXPORT_DIR / HEADS_FILE).is_file()


def test_first_step_is_the_loss_and_gradient_of_the_whole_accumulated_batch(setup: TinyTraining, reference_run: ReferenceRun) -> None:
    """Step 1's logged loss and grad norm equal one plain process's loss over the step's 4 samples
    (2 ranks x 2 micro-batches): normalised over the whole batch, not summed over micro-steps or
    averaged over ranks."""
    settings = setup.settings()
    profile = setup.profile()
    dataset = CachedSamples(open_training_cache(profile, setup.fp32_cache).reader, prompt_builder(profile))
    per_rank = settings.micro_batch * settings.grad_accum
    rows = [row for rank in range(N_PROC)
            for row in Mixture((len(dataset),), (1.0,), settings.seed).rank_rows(0, rank, N_PROC)[:per_rank]]
    batches = [collate([dataset[row]], pad_token_id=dataset.builder.pad_token_id) for row in rows]
    config = settings.loss_config()
    denominators = LossDenominators.from_batches(batches)

    model = setup.model()
    loss = sum(micro_batch_loss(model(b).loss_parts, denominators, config, step=0) for b in batches)
    loss.backward()
    grad_norm = torch.linalg.vector_norm(
        torch.stack([p.grad.norm() for p in model.parameters() if p.grad is not None])).item()

    step1 = reference_run.records[0]
    assert step1["loss"] == pytest.approx(loss.item(), rel=1e-5)
    assert step1["grad_norm"] == pytest.approx(grad_norm, rel=1e-4)


def test_metrics_have_the_documented_fields_with_sane_values(setup: TinyTraining, reference_run: ReferenceRun) -> None:
    settings, profile = setup.settings(), setup.profile()
    per_image = visual_tokens(Resolution.parse(profile.cache.resolution))
    samples_per_step = settings.micro_batch * settings.grad_accum * N_PROC
    fields = {"step", "epoch", "loss", "token_loss", "action_loss", "distill_loss_weight", "action_accuracy", "grad_norm", "lr",
              "samples_per_s", "tokens_per_s", "images_per_sample", "visual_tokens_per_sample", "data_wait_s",
              "compute_s", "step_s", "data_wait_share"} | {f"loss_{name}" for name in SEGMENT_NAMES}
    for r in reference_run.records:
        assert fields <= set(r), f"missing {fields - set(r)}"
        # Counted from the images of each sample, not their patches: the history + the current view.
        assert r["images_per_sample"] == profile.cache.history + 1
        assert r["visual_tokens_per_sample"] == (profile.cache.history + 1) * per_image
        assert r["distill_loss_weight"] == settings.distill_loss_weight  # no ramp in the tiny profile
        assert r["loss"] == pytest.approx(r["token_loss"] + r["distill_loss_weight"] * r["action_loss"], rel=1e-9)
        assert min(r[f"loss_{name}"] for name in SEGMENT_NAMES) > 0
        assert r["step_s"] == pytest.approx(r["data_wait_s"] + r["compute_s"], rel=1e-9)
        assert r["samples_per_s"] * r["step_s"] == pytest.approx(samples_per_step, rel=1e-6)
        assert r["tokens_per_s"] * r["step_s"] > samples_per_step * r["visual_tokens_per_sample"]
        assert 0 <= r["data_wait_share"] < 1 and r["compute_s"] > 0 and r["grad_norm"] > 0
        assert 0 <= r["action_accuracy"] <= 1
        # The LR the step applied: warm-up + cosine over the run's steps.
        assert r["lr"] == pytest.approx(LR * LRSchedule.of(MAX_STEPS, settings.warmup_ratio).factor(r["step"] - 1),
                                        rel=1e-9)
        assert r["epoch"] == (r["step"] - 1) // 2  # 2 steps per epoch: the epoch of the step's last sample
    assert list((reference_run.out / "tensorboard").glob("events.out.tfevents.*"))


def test_live_check_recomputes_a_batch_live_every_n_steps(setup: TinyTraining, reference_run: ReferenceRun) -> None:
    """``live_check_every: 5``: steps 5 and 10 log the difference between the cached features of a
    micro-batch and the frozen VGGT's recomputation, and between the losses they give. The
    reference cache holds float32 features, so both are float32 rounding noise at most."""
    every = setup.settings().live_check_every
    checked = [r for r in reference_run.records if "live_feature_max_abs" in r]
    assert [r["step"] for r in checked] == list(range(every, MAX_STEPS + 1, every))
    for r in checked:
        assert 0 <= r["live_feature_max_abs"] <= 1e-5
        assert 0 <= r["live_loss_rel_diff"] <= 1e-6


# ----------------------------------------------------------------------------------------------
# inputs: cached vs live, micro-batch 2 vs 1


def test_live_two_process_run_with_micro_batch_2_starts_with_the_cached_runs_loss(
        setup: TinyTraining, reference_run: ReferenceRun, tmp_path: Path) -> None:
    """Through the real trainer: a ``--live-data`` run (frames decoded and VGGT run in the step)
    with micro-batch 2 and no accumulation takes the same 4 samples in step 1 as the cached
    reference run (micro-batch 1, accumulation 2), so its step-1 loss and gradient norm match."""
    profile = write_train_profile(tmp_path / "live.yaml", cache={"feature_dtype": "float32"},
                                  train={"micro_batch": 2, "grad_accum": 1})
    out = tmp_path / "live-run"
    assert_succeeded(train_on_ranks("--out", out, "--live-data", setup.data, "--profile", profile,
                                    "--max-steps", 1, "--no-export"))
    live, cached = read_metrics(out)[0], reference_run.records[0]
    assert live["step"] == cached["step"] == 1
    for name in ("loss", "token_loss", "action_loss", *(f"loss_{s}" for s in SEGMENT_NAMES)):
        assert live[name] == pytest.approx(cached[name], rel=1e-5), name
    assert live["grad_norm"] == pytest.approx(cached["grad_norm"], rel=1e-4)
    assert live["images_per_sample"] == cached["images_per_sample"]


def test_the_h800_profiles_16_loader_workers_per_rank_train_alike_with_one_note_and_no_torch_warning(
        setup: TinyTraining, reference_run: ReferenceRun, tmp_path: Path) -> None:
    """16 DataLoader worker processes per rank (the h800 profile's value) on this machine's cores:
    step 1 has the in-process reference run's loss, and the advice to check the loader is one janus
    line, not torch's warning repeated at every DataLoader of every rank."""
    workers = max(16, usable_cores() + 1)  # more workers than cores, as on this machine
    profile = write_train_profile(tmp_path / "workers.yaml", cache={"feature_dtype": "float32"},
                                  train={"num_workers": workers})
    out = tmp_path / "workers-run"
    result = train_on_ranks("--out", out, "--cache", setup.fp32_cache, "--profile", profile, "--max-steps", 1,
                            "--no-export")
    assert_succeeded(result)
    assert read_metrics(out)[0]["loss"] == pytest.approx(reference_run.records[0]["loss"], rel=1e-6)
    notes = [line for line in result.stdout.splitlines() if line.startswith("note: train.num_workers")]
    assert notes == [f"note: train.num_workers is {workers} loader workers per process ({workers * N_PROC} on this "
                     f"node) for {usable_cores()} cores; if the step line's wait % is high, lower train.num_workers"]
    assert "This DataLoader will create" not in result.stdout + result.stderr


# ----------------------------------------------------------------------------------------------
# checkpoints, resume, export


def test_resume_after_step_k_repeats_the_uninterrupted_losses(reference_run: ReferenceRun, setup: TinyTraining,
                                                              tmp_path: Path) -> None:
    """A run directory holding only the step-3 checkpoint (mid-epoch: epoch 1, 4 of its 8 samples
    consumed by the 2 ranks together) is what a run killed after step 3 leaves; a new launch resumes there and its steps 4..10
    repeat the uninterrupted run's losses, gradient norms and LRs (data position, optimizer, LR
    schedule and RNG all come from the checkpoint)."""
    out = tmp_path / "run"
    tag = f"step{SAVE_EVERY:08d}"
    (out / CHECKPOINTS_DIR).mkdir(parents=True)
    shutil.copytree(reference_run.out / CHECKPOINTS_DIR / tag, out / CHECKPOINTS_DIR / tag)
    (out / CHECKPOINTS_DIR / "latest").write_text(tag)
    (out / METRICS_FILE).write_text("".join(json.dumps(r) + "\n" for r in reference_run.records[:SAVE_EVERY]))

    result = train_on_ranks("--out", out, "--cache", setup.fp32_cache, "--profile", setup.fp32_profile, "--no-export")
    assert_succeeded(result)
    assert f"resumed at step {SAVE_EVERY} (epoch 1, sample 4 of the epoch)" in result.stdout
    resumed = read_metrics(out)[SAVE_EVERY:]
    expected = reference_run.records[SAVE_EVERY:]
    assert [r["step"] for r in resumed] == list(range(SAVE_EVERY + 1, MAX_STEPS + 1))
    for got, want in zip(resumed, expected):
        for name in ("loss", "token_loss", "action_loss", "grad_norm", "lr", "epoch"):
            assert got[name] == pytest.approx(want[name], rel=1e-6, abs=1e-9), (got["step"], name)
    kept = sorted(p.name for p in (out / CHECKPOINTS_DIR).glob("step*"))
    assert kept == [f"step{s:08d}" for s in (3, 6, 9, 10)]


def exported_outputs(model: JanusVLNModel, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
    with torch.no_grad():
        out = model(batch, return_hidden=True)
    return {
        "action_logits": out.action_logits,
        "segment_ce_sum": out.loss_parts.segment_ce_sum,
        "segment_tokens": out.loss_parts.segment_tokens,
        "answer_logits": answer_logits(out.hidden_states, batch["labels"], model.qwen.lm_head.weight),
    }


def recorded_batch(setup: TinyTraining, run: ReferenceRun) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The engine's recorded outputs and the same samples as one micro-batch."""
    recorded = load_file(str(run.outputs))
    with safe_open(str(run.outputs), "pt") as f:
        metadata = f.metadata()
    profile = setup.profile()
    dataset = CachedSamples(open_training_cache(profile, setup.fp32_cache).reader, prompt_builder(profile))
    rows = json.loads(metadata["rows"])
    items = [dataset[row] for row in rows]
    assert [item.key for item in items] == json.loads(metadata["keys"])
    assert int(metadata["step"]) == MAX_STEPS
    return recorded, collate(items, pad_token_id=dataset.builder.pad_token_id)


def test_export_loads_in_transformers_and_reproduces_the_trained_engine(setup: TinyTraining, reference_run: ReferenceRun) -> None:
    """The end-of-run export is a Qwen2.5-VL directory transformers loads without missing or
    unexpected weights; with its heads (``load_exported``) it gives the trained engine's outputs
    (recorded by the run under ZeRO-3) on the same batch: answer-token logits, action logits and
    loss sums. The untrained model's outputs differ, so the match is not an accident."""
    from transformers import Qwen2_5_VLForConditionalGeneration

    export_dir = reference_run.out / EXPORT_DIR
    _, info = Qwen2_5_VLForConditionalGeneration.from_pretrained(str(export_dir), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert (export_dir / HEADS_FILE).is_file() and (export_dir / "tokenizer.json").is_file()

    recorded, batch = recorded_batch(setup, reference_run)
    assert recorded["answer_logits"].shape[0] == int(recorded["segment_tokens"].sum())
    exported = exported_outputs(load_exported(export_dir, setup.profile(), setup.settings().model_config()), batch)
    for name, value in recorded.items():
        assert torch.allclose(exported[name].to(value.dtype), value, rtol=1e-5, atol=1e-5), name
    untrained = exported_outputs(setup.model().eval(), batch)
    assert not torch.allclose(untrained["answer_logits"], recorded["answer_logits"], atol=1e-2)


def test_janus_train_export_writes_16_bit_weights_of_a_checkpoint(setup: TinyTraining, reference_run: ReferenceRun,
                                                                  tmp_path: Path) -> None:
    """``janus-train export RUN --out DIR --dtype bfloat16``: the same weights as the end-of-run
    export, rounded to bfloat16, loadable by transformers in that dtype."""
    from transformers import Qwen2_5_VLForConditionalGeneration
    from typer.testing import CliRunner

    from pipelines.train_cli import app

    out = tmp_path / "bf16-export"
    result = CliRunner().invoke(app, ["export", str(reference_run.out), "--out", str(out),
                                      "--profile", str(setup.fp32_profile), "--dtype", "bfloat16"])
    assert result.exit_code == 0, result.output
    qwen = Qwen2_5_VLForConditionalGeneration.from_pretrained(str(out), dtype=torch.bfloat16)
    assert qwen.dtype == torch.bfloat16
    fp32 = load_file(str(reference_run.out / EXPORT_DIR / "model.safetensors"))
    bf16 = load_file(str(out / "model.safetensors"))
    assert set(bf16) == set(fp32)
    for name, value in bf16.items():
        assert value.dtype == torch.bfloat16 and torch.equal(value, fp32[name].to(torch.bfloat16)), name
    heads = load_file(str(out / HEADS_FILE))
    assert heads and all(v.dtype == torch.bfloat16 for v in heads.values())

    empty = tmp_path / "no-run"
    empty.mkdir()
    missing = CliRunner().invoke(app, ["export", str(empty), "--out", str(tmp_path / "x"),
                                       "--profile", str(setup.fp32_profile)])
    assert missing.exit_code == 1 and "holds no checkpoint" in missing.output


# ----------------------------------------------------------------------------------------------
# start-up check


def test_training_refuses_a_cache_made_with_another_reference_frame(setup: TinyTraining, tmp_path: Path) -> None:
    """The launch exits non-zero before building any model, naming the differing field."""
    profile = write_train_profile(tmp_path / "first.yaml", cache={"feature_dtype": "float32", "reference_frame": "first"})
    out = tmp_path / "run"
    result = train_on_ranks("--out", out, "--cache", setup.fp32_cache, "--profile", profile)
    assert result.returncode != 0
    assert "window.reference_frame: cache has 'last'" in result.stderr
    assert not out.exists()
