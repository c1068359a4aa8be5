"""Validation: held-out episodes, val_* metrics averaged over all ranks, the best
checkpoint kept apart from the rotation.

The run (one launch of 2 processes, DeepSpeed ZeRO-3 over gloo): 3 episodes x 4 steps of
sample data precomputed into a real zarr cache (the session's, helpers.shared_runs); the tiny profile's own validation source (one
episode held out) capped at 3 of its 4 samples, so the ranks' shares differ (2 and 1: rank 1 runs
an uncounted filler micro-batch to keep ZeRO-3's collectives in step). 8 training samples, 4 per
step: 2 steps per epoch. 6 steps, validation every 2, a record every 3 steps, a checkpoint every 2
keeping 1; the best checkpoint by ``val_action_token_accuracy`` (a tie keeps the earlier one, so
the best is an early step whose own tag the rotation removes). A second launch resumes it to 8 steps
with the cache read in place from a bucket (held-out validation from s3:// as from disk).
The hold-out, its refusals and the metrics' small parts, in one process: tests/unit/test_holdout.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from helpers.s3_server import S3Server, janus_cache, succeeded
from helpers.shared_runs import TinyTraining
from helpers.training import assert_succeeded, read_metrics, train_on_ranks
from helpers.validation import (
    BEST,
    EPISODES,
    MAX_STEPS,
    RESUMED_STEPS,
    VAL_SAMPLES,
    assert_metrics_equal,
    hand_metrics,
    profile_with,
    validation_data,
    validation_of,
)
from janus_core.profile import load_profile
from janus_train.checkpoint.best import BEST_FILE, BEST_TAG
from janus_train.checkpoint.export import load_exported
from janus_train.config import load_train_settings
from janus_train.run.layout import CHECKPOINTS_DIR, EXPORT_DIR


@pytest.fixture(scope="module")
def built(three_episodes: TinyTraining, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return validation_data(three_episodes, tmp_path_factory.mktemp("validation"))


@pytest.fixture(scope="module")
def run(built: dict[str, Path]) -> dict[str, Any]:
    out = built["root"] / "run"
    result = train_on_ranks("--out", out, "--cache", built["cache"], "--profile", built["profile"])
    assert_succeeded(result)
    records = read_metrics(out)
    best = json.loads((out / CHECKPOINTS_DIR / BEST_TAG / BEST_FILE).read_text())
    return {"out": out, "stdout": result.stdout, "records": records, "best": best}


def expected_best(evaluated: list[dict[str, Any]]) -> dict[str, Any]:
    """The first validation reaching the highest accuracy."""
    top = max(r[BEST] for r in evaluated)
    return next(r for r in evaluated if r[BEST] == top)


# ----------------------------------------------------------------------------------------------
# the held-out episodes


def test_an_unusable_hold_out_ends_the_launch_in_one_line(built: dict[str, Path], tmp_path: Path) -> None:
    profile = profile_with(tmp_path / "all.yaml", val_episodes=EPISODES)
    result = train_on_ranks("--out", tmp_path / "run", "--cache", built["cache"], "--profile", profile, nproc=1)
    assert result.returncode != 0
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors == [f"error: {profile}: train.val_episodes / val_episodes_fraction: holding out 3 of 3 episodes "
                      "for validation leaves none to train on"]
    assert "janus_train/loop/validation.py" not in result.stderr  # no traceback from the rank


# ----------------------------------------------------------------------------------------------
# the run


def test_validation_runs_every_eval_every_steps_and_at_the_end(run: dict[str, Any]) -> None:
    records = run["records"]
    # Validation steps are logged even between log_every steps.
    assert [r["step"] for r in records] == [2, 3, 4, 6]
    assert [r["step"] for r in records if "val_loss" in r] == [2, 4, 6]
    # 8 training samples (the held-out episode's 4 never train): 2 steps per epoch.
    assert [r["epoch"] for r in records] == [0, 1, 1, 2]
    assert any(line.endswith("; validating on 3 samples of 1 held-out episode") for line in run["stdout"].splitlines())
    lines = [line for line in run["stdout"].splitlines() if line.startswith("step ")]
    assert [" | val loss " in line for line in lines] == [True, False, True, True]
    # TensorBoard shows the training and the validation metrics in sections of their own.
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run["out"] / "tensorboard"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"train/loss", "train/lr", "val/loss", "val/action_accuracy"} <= tags, sorted(tags)
    assert [e.step for e in events.Scalars("val/loss")] == [2, 4, 6]
    assert all(tag.split("/")[0] in ("train", "val") for tag in tags), sorted(tags)


def test_the_final_val_metrics_equal_a_hand_computation_over_all_val_samples(
        built: dict[str, Path], run: dict[str, Any]) -> None:
    """The exported final model, one process, sample by sample: the logged val_* of the last step
    (2 ranks, shares of 2 and 1 samples, sums all-reduced) are the exact averages over all 3."""
    dataset, _, validation = validation_of(built)
    profile = load_profile(built["profile"])
    model = load_exported(run["out"] / EXPORT_DIR, profile, load_train_settings(profile).model_config()).eval()
    final = run["records"][-1]
    assert final["step"] == MAX_STEPS and final["val_samples"] == VAL_SAMPLES
    assert_metrics_equal(final, hand_metrics(model, dataset, validation.rows, final["distill_loss_weight"]))
    assert 0 <= final["val_action_token_accuracy"] <= 1 and final["val_loss"] > final["val_token_loss"]


def test_the_best_checkpoint_is_kept_apart_from_rotation(built: dict[str, Path], run: dict[str, Any],
                                                         tmp_path: Path) -> None:
    """save_total_limit 1 keeps only the last step's tag, and checkpoints/best holds the best
    validation's weights, an earlier step's: exported with ``janus-train export --tag best`` they
    give that step's val metrics."""
    from typer.testing import CliRunner

    from pipelines.train_cli import app

    evaluated = [r for r in run["records"] if "val_loss" in r]
    best = expected_best(evaluated)
    assert best["step"] < MAX_STEPS, "the best is the last step: the test would not tell best from latest"
    assert run["best"] == {"metric": BEST, "value": best[BEST], "step": best["step"]}
    assert [r["val_best"] for r in evaluated] == [r is expected_best(evaluated[: i + 1])
                                                  for i, r in enumerate(evaluated)]
    checkpoints = run["out"] / CHECKPOINTS_DIR
    assert sorted(p.name for p in checkpoints.iterdir() if p.is_dir()) == [BEST_TAG, f"step{MAX_STEPS:08d}"]
    assert (checkpoints / "latest").read_text().strip() == f"step{MAX_STEPS:08d}"

    exported = tmp_path / "best-export"
    result = CliRunner().invoke(app, ["export", str(run["out"]), "--out", str(exported), "--tag", BEST_TAG,
                                      "--profile", str(built["profile"])])
    assert result.exit_code == 0, result.output
    dataset, _, validation = validation_of(built)
    profile = load_profile(built["profile"])
    model = load_exported(exported, profile, load_train_settings(profile).model_config()).eval()
    assert_metrics_equal(best, hand_metrics(model, dataset, validation.rows, best["distill_loss_weight"]))
    assert best["val_loss"] != pytest.approx(evaluated[-1]["val_loss"], rel=1e-3)  # not the latest weights


def test_a_resume_reading_the_cache_from_a_bucket_validates_on_the_same_held_out_samples_and_keeps_the_best(
        built: dict[str, Path], run: dict[str, Any], s3_server: S3Server) -> None:
    """A second launch continues the run to 8 steps with its cache read in place from a bucket of a
    real S3 server (``janus-cache push``, then ``--cache s3://...``): it holds out the same episode,
    so its validation at 8 gives the exact val_* of its exported step-8 model over the 3 held-out
    samples of the local cache; and it keeps the best of all four validations, whichever part of
    the run it came from."""
    url = f"{s3_server.url('validation')}/{built['cache'].name}"  # the run names its cache after it
    succeeded(janus_cache(s3_server, "push", built["cache"], url))
    result = train_on_ranks("--out", run["out"], "--cache", url, "--profile", built["profile"],
                            "--max-steps", RESUMED_STEPS, env=s3_server.env())
    assert_succeeded(result)
    assert f"resumed at step {MAX_STEPS}" in result.stdout
    evaluated = [r for r in read_metrics(run["out"]) if "val_loss" in r]
    assert [r["step"] for r in evaluated] == [2, 4, 6, 8]
    final = evaluated[-1]
    dataset, _, validation = validation_of(built)
    profile = load_profile(built["profile"])
    model = load_exported(run["out"] / EXPORT_DIR, profile, load_train_settings(profile).model_config()).eval()
    assert final["val_samples"] == VAL_SAMPLES
    assert_metrics_equal(final, hand_metrics(model, dataset, validation.rows, final["distill_loss_weight"]))

    best = expected_best(evaluated)
    kept = json.loads((run["out"] / CHECKPOINTS_DIR / BEST_TAG / BEST_FILE).read_text())
    assert kept == {"metric": BEST, "value": best[BEST], "step": best["step"]}
    assert final["val_best"] == (best["step"] == RESUMED_STEPS)
