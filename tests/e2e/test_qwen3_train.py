"""Training a Qwen3-VL base from its cache: DeepSpeed ZeRO-3, 2 forked ranks (train_on_ranks) on the
CPU (gloo), the tiny Qwen3-VL; the base comes from qwen.path alone.

The data: 2 episodes x 4 steps of sample data = 8 samples (and a second set of 6 for a mixture),
precomputed into Qwen3-VL caches (256x256 Qwen3-VL frames paired with pad224 VGGT features, float32
features). The reference run: micro-batch 1 x accumulation 2 x 2 processes, 10 steps, a checkpoint
every 3, its final outputs recorded on two samples, the end-of-run export."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from safetensors import safe_open
from safetensors.torch import load_file
from transformers import Qwen3VLForConditionalGeneration

from helpers.training import (
    MAX_STEPS,
    SAVE_EVERY,
    assert_succeeded,
    precompute,
    read_metrics,
    train_on_ranks,
    write_train_profile,
)
from janus_cache.store import load_manifest
from janus_core.bases import QWEN3_VL
from janus_core.profile import load_profile
from janus_core.sample_data import write_sample_data
from janus_train.build import prompt_builder
from janus_train.checkpoint.export import HEADS_FILE, load_exported
from janus_train.config import load_train_settings
from janus_train.data.from_profile import open_training_cache
from janus_train.data.samples import CachedSamples, collate
from janus_train.loop.trainer import answer_logits
from janus_train.run.layout import CHECKPOINTS_DIR, EXPORT_DIR, METRICS_FILE

QWEN3_DIR = Path(__file__).resolve().parents[2] / "configs" / "models" / "tiny-qwen3_vl"
RECORDED_SAMPLES = 2


def qwen3_profile(path: Path, train: dict | None = None) -> Path:
    """The tests' training profile (tests/helpers/training.py) on the tiny Qwen3-VL, float32 features,
    without the live feature check (whose VGGT frames come from the dataset: --data)."""
    write_train_profile(path, cache={"feature_dtype": "float32"}, train={"live_check_every": 0, **(train or {})})
    data = yaml.safe_load(path.read_text())
    data["qwen"]["path"] = str(QWEN3_DIR)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("qwen3-train")
    profile = qwen3_profile(root / "qwen3.yaml")
    data = write_sample_data(root / "data", episodes=2, steps=4, seed=0)
    other = write_sample_data(root / "data-b", episodes=2, steps=3, seed=1)
    cache = precompute(data, root / "cache", profile)
    out = root / "run"
    outputs = out / "final_outputs.safetensors"
    assert_succeeded(train_on_ranks("--out", out, "--cache", cache, "--profile", profile,
                                    "--record-outputs", outputs, "--record-samples", RECORDED_SAMPLES))
    return {"root": root, "profile": profile, "data": data, "cache": cache, "cache_b": precompute(other, root / "cache-b",
                                                                                                   profile),
            "run": out, "outputs": outputs}


def test_a_two_process_zero3_run_trains_qwen3_vl_from_its_own_frames(qwen3: dict[str, Path]) -> None:
    manifest = load_manifest(qwen3["cache"])
    assert manifest.base == QWEN3_VL.model_type
    assert next(iter(manifest.resolutions.values())).frame_shape == (256, 256, 3)  # pad224's paired frame
    records = read_metrics(qwen3["run"])
    assert [r["step"] for r in records] == list(range(1, MAX_STEPS + 1))
    assert all(math.isfinite(r["loss"]) and math.isfinite(r["grad_norm"]) for r in records)
    first, last = sum(r["loss"] for r in records[:2]) / 2, sum(r["loss"] for r in records[-2:]) / 2
    assert last < first - 0.5, f"loss went from {first:.3f} to {last:.3f}"


def test_a_qwen3_run_resumed_after_step_k_repeats_the_uninterrupted_run_bit_for_bit(
    qwen3: dict[str, Path], tmp_path: Path,
) -> None:
    """Only the step-3 checkpoint (mid-epoch) of the run: a new launch resumes there and its steps
    4..10 equal the uninterrupted run's losses, gradient norms and LRs exactly."""
    out = tmp_path / "run"
    tag = f"step{SAVE_EVERY:08d}"
    (out / CHECKPOINTS_DIR).mkdir(parents=True)
    shutil.copytree(qwen3["run"] / CHECKPOINTS_DIR / tag, out / CHECKPOINTS_DIR / tag)
    (out / CHECKPOINTS_DIR / "latest").write_text(tag)
    reference = read_metrics(qwen3["run"])
    (out / METRICS_FILE).write_text("".join(json.dumps(r) + "\n" for r in reference[:SAVE_EVERY]))
    result = train_on_ranks("--out", out, "--cache", qwen3["cache"], "--profile", qwen3["profile"], "--no-export")
    assert_succeeded(result)
    assert f"resumed at step {SAVE_EVERY} (epoch 1, sample 4 of the epoch)" in result.stdout
    resumed = read_metrics(out)[SAVE_EVERY:]
    assert [r["step"] for r in resumed] == list(range(SAVE_EVERY + 1, MAX_STEPS + 1))
    for got, want in zip(resumed, reference[SAVE_EVERY:], strict=True):
        for name in ("loss", "token_loss", "action_loss", "grad_norm", "lr", "epoch"):
            assert got[name] == want[name], (got["step"], name)


def test_the_qwen3_export_loads_as_qwen3_vl_and_reproduces_the_trained_engine(qwen3: dict[str, Path]) -> None:
    """The end-of-run export (--format janus) loads with Qwen3VLForConditionalGeneration with no
    missing or unexpected weight; with its heads (load_exported) it gives the outputs the ZeRO-3
    engine recorded on the same samples."""
    export_dir = qwen3["run"] / EXPORT_DIR
    _, info = Qwen3VLForConditionalGeneration.from_pretrained(str(export_dir), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert (export_dir / HEADS_FILE).is_file()

    profile = load_profile(qwen3["profile"])
    recorded = load_file(str(qwen3["outputs"]))
    with safe_open(str(qwen3["outputs"]), "pt") as f:
        rows = json.loads(f.metadata()["rows"])
    dataset = CachedSamples(open_training_cache(profile, qwen3["cache"]).reader, prompt_builder(profile))
    batch = collate([dataset[row] for row in rows], pad_token_id=dataset.builder.pad_token_id)
    model = load_exported(export_dir, profile, load_train_settings(profile).model_config())
    assert model.base is QWEN3_VL
    with torch.no_grad():
        out = model(batch, return_hidden=True)
    exported = {"action_logits": out.action_logits, "segment_ce_sum": out.loss_parts.segment_ce_sum,
                "segment_tokens": out.loss_parts.segment_tokens,
                "answer_logits": answer_logits(out.hidden_states, batch["labels"], model.qwen.lm_head.weight)}
    for name, value in recorded.items():
        assert torch.allclose(exported[name].to(value.dtype), value, rtol=1e-5, atol=1e-5), name


def test_the_reference_layout_export_of_a_qwen3_run_is_one_line(qwen3: dict[str, Path], tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from pipelines.train_cli import app

    out = tmp_path / "janusvln"
    result = CliRunner().invoke(app, ["export", str(qwen3["run"]), "--out", str(out), "--profile",
                                      str(qwen3["profile"]), "--format", "janusvln"])
    assert result.exit_code == 1 and not out.exists()
    assert result.output.strip().splitlines()[-1].endswith("is Qwen3-VL; export it with --format janus")


def test_a_qwen3_mixture_with_validation_trains_and_validates(qwen3: dict[str, Path], tmp_path: Path) -> None:
    """Two Qwen3-VL caches weighted 3:1, one episode held out for validation every 2 steps."""
    profile = qwen3_profile(tmp_path / "mixture.yaml", train={
        "max_steps": 4, "log_sample_keys": True, "val_episodes": 1, "val_max_samples": 4, "eval_every": 2,
        "best_metric": "val_loss"})
    out = tmp_path / "run"
    result = train_on_ranks("--out", out, "--cache", f"a={qwen3['cache']}:3", "--cache", f"b={qwen3['cache_b']}:1",
                            "--profile", profile, "--no-export")
    assert_succeeded(result)
    assert "from a (weight 3), b (weight 1)" in result.stdout
    records = read_metrics(out)
    assert [r["step"] for r in records if "val_loss" in r] == [2, 4]
    assert all(math.isfinite(r["val_loss"]) for r in records if "val_loss" in r)
    sources = {key.split("/")[0] for r in records for key in r["sample_keys"]}
    assert sources == {"a", "b"}


def test_the_live_check_of_a_qwen3_cache_decodes_vggts_frames_from_its_dataset(
    qwen3: dict[str, Path], tmp_path: Path,
) -> None:
    """``train.live_check_every`` on a Qwen3-VL cache recomputes a batch's features from VGGT's frames
    of the dataset's sources (the cache holds Qwen3-VL's): without --data it is refused at start in
    one line, with no run directory left; with --data the checks of a real run match the cache."""
    checked = qwen3_profile(tmp_path / "checked.yaml", train={"live_check_every": 2, "log_sample_keys": True})
    refused = train_on_ranks("--out", tmp_path / "refused", "--cache", qwen3["cache"], "--profile", checked, nproc=1)
    assert refused.returncode != 0
    assert [line for line in refused.stderr.splitlines() if line.startswith("error:")] == [
        f"error: {checked}: train.live_check_every on a Qwen3-VL cache decodes VGGT's frames from the dataset's "
        "source files (the cache holds Qwen3-VL's frames): train one --cache with --data, the dataset it was built "
        "from (make train ... DATA=...), or set train.live_check_every: 0"]
    assert not (tmp_path / "refused").exists()

    out = tmp_path / "checked"
    result = train_on_ranks("--out", out, "--cache", qwen3["cache"], "--data", qwen3["data"], "--profile", checked,
                            "--max-steps", 4, "--no-export", nproc=1)
    assert_succeeded(result)
    assert "warning: live check" not in result.stderr
    checks = [r for r in read_metrics(out) if "live_feature_max_abs" in r]
    assert [r["step"] for r in checks] == [2, 4]
    assert all(0 <= r["live_feature_max_abs"] <= 1e-4 and r["live_loss_rel_diff"] <= 1e-3 for r in checks)
    assert all(r["live_feature_sample"] in r["sample_keys"] for r in checks)
