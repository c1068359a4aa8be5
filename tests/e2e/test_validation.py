"""Validation (issue 14, item 1): held-out episodes, val_* metrics averaged over all ranks, the best
checkpoint kept apart from the rotation.

The run (one torchrun launch, 2 processes, DeepSpeed ZeRO-3 over gloo): 3 episodes x 4 steps of
sample data precomputed into a real zarr cache; the tiny profile's own validation source (one
episode held out) capped at 3 of its 4 samples, so the ranks' shares differ (2 and 1: rank 1 runs
an uncounted filler micro-batch to keep ZeRO-3's collectives in step). 8 training samples, 4 per
step: 2 steps per epoch. 6 steps, validation every 2, a record every 3 steps, a checkpoint every 2
keeping 1; the best checkpoint by ``val_action_token_accuracy`` (a tie keeps the earlier one, so
the best is an early step whose own tag the rotation removes). A second launch resumes it to 8 steps.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
import yaml
from helpers.profiles import write_test_profile
from helpers.training import assert_succeeded, precompute, read_metrics, torchrun_train

from janus_cache.index import ACTIONS, build_index
from janus_cache.profile import ProfileError, load_profile
from janus_cache.resolution import Resolution
from janus_cache.sample_data import write_sample_data
from janus_train.best_checkpoint import BEST_FILE, BEST_TAG
from janus_train.config import load_train_settings
from janus_train.data import CachedSamples, LiveSamples, collate
from janus_train.export import load_exported
from janus_train.holdout import HoldoutError, heldout_count, split_by_episode
from janus_train.logs import step_line
from janus_train.prompt import PromptFields, collate_prompts
from janus_train.segments import SEGMENT_NAMES
from janus_train.trainer import CHECKPOINTS, EXPORT_DIR, open_training_cache, prompt_builder
from janus_train.val_metric_names import BEST_METRICS, better
from janus_train.validation import (
    ActionSpan,
    action_tokens_correct,
    ValidationError,
    ValidationSet,
    episode_ids,
    plan_validation,
)

EPISODES, STEPS = 3, 4
VAL_SAMPLES = 3
MAX_STEPS, RESUMED_STEPS = 6, 8
EVAL_EVERY = 2
LR = 2e-3
TRAIN = {"micro_batch": 1, "grad_accum": 2, "epochs": 100, "max_steps": MAX_STEPS, "lr_base": LR, "lr_projector": LR,
         "warmup_ratio": 0.0, "save_every": 2, "save_total_limit": 1, "log_every": 3, "num_workers": 0,
         "eval_every": EVAL_EVERY, "val_max_samples": VAL_SAMPLES, "best_metric": "val_action_token_accuracy"}
BEST = TRAIN["best_metric"]


def profile_with(path: Path, **train: Any) -> Path:
    """The tiny profile with its validation settings and the test's (absolute model paths)."""
    write_test_profile(path, keep_validation=True)
    data = yaml.safe_load(path.read_text())
    data["train"].update({**TRAIN, **train})
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("validation")
    data = write_sample_data(root / "data", episodes=EPISODES, steps=STEPS, seed=0)
    profile = profile_with(root / "tiny.yaml")
    return {"root": root, "data": data, "profile": profile, "cache": precompute(data, root / "cache", profile)}


@pytest.fixture(scope="module")
def run(built: dict[str, Path]) -> dict[str, Any]:
    out = built["root"] / "run"
    result = torchrun_train("--out", out, "--cache", built["cache"], "--profile", built["profile"])
    assert_succeeded(result)
    records = read_metrics(out)
    best = json.loads((out / CHECKPOINTS / BEST_TAG / BEST_FILE).read_text())
    return {"out": out, "stdout": result.stdout, "records": records, "best": best}


def validation_of(built: dict[str, Path]) -> tuple[CachedSamples, Any, ValidationSet]:
    profile = load_profile(built["profile"])
    dataset = CachedSamples(open_training_cache(profile, built["cache"]).reader, prompt_builder(profile))
    train, validation = plan_validation(load_train_settings(profile), dataset)
    assert validation is not None
    return dataset, train, validation


def hand_metrics(model: torch.nn.Module, dataset: CachedSamples, rows: tuple[int, ...],
                 distill_weight: float) -> dict[str, float]:
    """The val_* metrics of ``model`` over ``rows``, one sample at a time in one process. The action
    name's tokens are found from the text (the tokens of " <ACTION>" just before the closing
    ``<|im_end|>\\n``), and the greedy prediction at each is the argmax of the full LM logits."""
    tokenizer = dataset.builder.tokenizer
    closing = len(tokenizer("<|im_end|>\n", add_special_tokens=False)["input_ids"])
    weighted = weights = action_ce = head_right = name_right = 0.0
    segment_ce, segment_n = [0.0] * 4, [0] * 4
    for row in rows:
        item = dataset[row]
        batch = collate([item], dataset.builder.pad_token_id)
        with torch.no_grad():
            out = model(batch, return_hidden=True)
            logits = model.qwen.lm_head(out.hidden_states[0]).float()  # [L, vocab]
        labels, seg, w = batch["labels"][0], batch["segment_ids"][0], batch["loss_weights"][0]
        ce = F.cross_entropy(logits[:-1], labels[1:], ignore_index=-100, reduction="none")
        supervised = labels[1:] != -100
        weighted += float((ce * w[1:])[supervised].sum())
        weights += float(w.sum())
        for k in range(4):
            mask = supervised & (seg[1:] == k + 1)
            segment_ce[k] += float(ce[mask].sum())
            segment_n[k] += int(mask.sum())
        head = out.action_logits[0].float()
        action_ce += float(F.cross_entropy(head[None], batch["action_ids"]))
        head_right += float(head.argmax() == batch["action_ids"][0])
        name = tokenizer(" " + ACTIONS[item.prompt.action_id], add_special_tokens=False)["input_ids"]
        end = int(supervised.nonzero().max()) + 2 - closing  # first closing token
        positions = torch.arange(end - len(name), end)
        assert labels[positions].tolist() == name, "the action name is not where the prompt puts it"
        name_right += float(bool((logits[positions - 1].argmax(-1) == labels[positions]).all()))
    n = len(rows)
    token_loss = weighted / weights
    metrics = {"val_loss": token_loss + distill_weight * action_ce / n, "val_token_loss": token_loss,
               "val_action_loss": action_ce / n, "val_action_accuracy": head_right / n,
               "val_action_token_accuracy": name_right / n, "val_samples": n}
    metrics.update({f"val_loss_{s}": segment_ce[k] / segment_n[k] for k, s in enumerate(SEGMENT_NAMES)})
    return metrics


def expected_best(evaluated: list[dict[str, Any]]) -> dict[str, Any]:
    """The first validation reaching the highest accuracy."""
    top = max(r[BEST] for r in evaluated)
    return next(r for r in evaluated if r[BEST] == top)


def assert_metrics_equal(logged: dict[str, Any], expected: dict[str, float]) -> None:
    for name, value in expected.items():
        assert logged[name] == pytest.approx(value, rel=1e-5, abs=1e-7), name


# ----------------------------------------------------------------------------------------------
# the held-out episodes


def test_held_out_episodes_are_whole_disjoint_from_training_and_chosen_by_seed(built: dict[str, Path]) -> None:
    dataset, train, validation = validation_of(built)
    episodes = episode_ids(dataset)
    assert episodes == [dataset.reader.sample(row).meta.extra["episode_id"] for row in range(len(dataset))]
    train_rows = [train.indices[i] for i in range(len(train))]
    val_episodes = {episodes[row] for row in validation.rows}
    assert len(val_episodes) == 1 and len(set(episodes)) == EPISODES
    assert not val_episodes & {episodes[row] for row in train_rows}
    # Every sample of the other episodes trains; the held-out episode's samples never do.
    assert sorted(train_rows) == [row for row, e in enumerate(episodes) if e not in val_episodes]
    assert [train[i].key for i in range(len(train))] == [dataset[row].key for row in train_rows]
    assert len(validation.rows) == VAL_SAMPLES and set(validation.rows) < {
        row for row, e in enumerate(episodes) if e in val_episodes}
    # Deterministic from the seed: the same choice again; another seed moves it.
    assert split_by_episode(episodes, 1, seed=0) == split_by_episode(episodes, 1, seed=0)
    chosen = {split_by_episode(episodes, 1, seed=s).val_episodes for s in range(8)}
    assert len(chosen) > 1


def test_live_data_holds_out_the_same_episodes_as_its_cache(built: dict[str, Path]) -> None:
    """``--live-data`` runs read the episodes from the dataset index: the same choice, the same rows."""
    profile = load_profile(built["profile"])
    live = LiveSamples(build_index(built["data"], history=profile.cache.history), prompt_builder(profile),
                       Resolution.parse(profile.cache.resolution))
    cached, _, validation = validation_of(built)
    live_train, live_validation = plan_validation(load_train_settings(profile), live)
    assert live_validation is not None and live_validation.rows == validation.rows
    assert [live.index.samples[row].key for row in validation.rows] == [cached[row].key for row in validation.rows]
    assert len(live_train) == len(cached) - STEPS


def test_hold_out_counts_and_refusals() -> None:
    assert heldout_count(200, fraction=0.01) == 2
    assert heldout_count(3, fraction=0.01) == 1  # a positive fraction holds out at least one
    assert heldout_count(10, episodes=4) == 4 and heldout_count(10) == 0
    with pytest.raises(HoldoutError, match="holding out 3 of 3 episodes for validation leaves none to train on"):
        heldout_count(3, episodes=3)


def test_a_hold_out_of_every_episode_is_a_one_line_error(built: dict[str, Path], tmp_path: Path) -> None:
    profile = load_profile(profile_with(tmp_path / "all.yaml", val_episodes=EPISODES))
    dataset = CachedSamples(open_training_cache(profile, built["cache"]).reader, prompt_builder(profile))
    with pytest.raises(ValidationError, match="^train.val_episodes / val_episodes_fraction: holding out 3 of 3 "
                                              "episodes for validation leaves none to train on$"):
        plan_validation(load_train_settings(profile), dataset)


def test_an_unusable_hold_out_ends_the_launch_in_one_line(built: dict[str, Path], tmp_path: Path) -> None:
    profile = profile_with(tmp_path / "all.yaml", val_episodes=EPISODES)
    result = torchrun_train("--out", tmp_path / "run", "--cache", built["cache"], "--profile", profile, nproc=1)
    assert result.returncode != 0
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors == [f"error: {profile}: train.val_episodes / val_episodes_fraction: holding out 3 of 3 episodes "
                      "for validation leaves none to train on"]
    assert "janus_train/validation.py" not in result.stderr  # no traceback from the rank


def test_two_validation_sources_are_refused_naming_the_file(built: dict[str, Path], tmp_path: Path) -> None:
    path = profile_with(tmp_path / "two.yaml", val_cache=str(built["cache"]))  # + the tiny profile's val_episodes
    with pytest.raises(ProfileError) as err:
        load_train_settings(load_profile(path))
    assert str(err.value) == (f"{path}: section 'train': settings val_cache and val_episodes each name a "
                              "validation source; keep one")


def test_a_validation_cache_is_validated_whole_and_training_keeps_every_sample(built: dict[str, Path]) -> None:
    profile = load_profile(built["profile"])
    settings = replace(load_train_settings(profile), val_episodes=0, val_cache=built["cache"], val_max_samples=0)
    dataset = CachedSamples(open_training_cache(profile, built["cache"]).reader, prompt_builder(profile))
    train, validation = plan_validation(settings, dataset, dataset)
    assert train is dataset and validation is not None
    assert validation.rows == tuple(range(len(dataset)))


def test_the_profiles_validate() -> None:
    """The tiny profile (the demo) holds out an episode and validates within its run; h800 holds
    out 1% of the episodes and validates at every checkpoint."""
    tiny = load_train_settings(load_profile("tiny"))
    assert tiny.val_episodes == 1 and 0 < tiny.eval_every and tiny.best_metric == "val_loss"
    h800 = yaml.safe_load((Path(__file__).parents[2] / "configs/profiles/h800.yaml").read_text())["train"]
    assert h800["val_episodes_fraction"] == 0.01 and h800["eval_every"] == h800["save_every"]


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
    assert list((run["out"] / "tensorboard").glob("events.out.tfevents.*"))


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
    checkpoints = run["out"] / CHECKPOINTS
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


def test_the_best_checkpoint_survives_a_resume(built: dict[str, Path], run: dict[str, Any]) -> None:
    """A second launch continues the run to 8 steps: it validates at 8 and keeps the best of all
    four validations, whichever part of the run it came from."""
    result = torchrun_train("--out", run["out"], "--cache", built["cache"], "--profile", built["profile"],
                            "--max-steps", RESUMED_STEPS, "--no-export")
    assert_succeeded(result)
    assert f"resumed at step {MAX_STEPS}" in result.stdout
    evaluated = [r for r in read_metrics(run["out"]) if "val_loss" in r]
    assert [r["step"] for r in evaluated] == [2, 4, 6, 8]
    best = expected_best(evaluated)
    kept = json.loads((run["out"] / CHECKPOINTS / BEST_TAG / BEST_FILE).read_text())
    assert kept == {"metric": BEST, "value": best[BEST], "step": best["step"]}
    assert evaluated[-1]["val_best"] == (best["step"] == RESUMED_STEPS)


# ----------------------------------------------------------------------------------------------
# small parts


def test_losses_are_best_lowest_and_accuracies_highest() -> None:
    assert better("val_loss", 1.0, 2.0) and not better("val_loss", 2.0, 1.0) and not better("val_loss", 1.0, 1.0)
    assert better("val_action_accuracy", 0.75, 0.5) and not better("val_action_token_accuracy", 0.5, 0.75)
    assert better("val_loss", 3.0, None) and not better("val_loss", math.nan, None)
    assert set(BEST_METRICS) >= {"val_loss", "val_action_accuracy", "val_action_token_accuracy"}


def test_the_step_line_shows_the_validation_compactly() -> None:
    record = {"step": 30, "epoch": 2, "loss": 1.5, "token_loss": 1.25, "action_loss": 0.25, "grad_norm": 0.5,
              "lr": 1e-4, "samples_per_s": 12.5, "data_wait_share": 0.07, "step_s": 2.0, "nonfinite_skips": 0,
              "val_loss": 1.75, "val_action_accuracy": 0.75, "val_action_token_accuracy": 0.5, "val_best": True}
    assert step_line(record, 100, eta_s=60).endswith("| eta 0:01:00 | val loss 1.7500 acc head 0.75 lm 0.50 (best)")
    assert step_line({**record, "val_best": False}, 100, eta_s=60).endswith("| val loss 1.7500 acc head 0.75 lm 0.50")


def test_the_action_token_accuracy_needs_every_token_of_the_action_name() -> None:
    """The action name's positions are the tokens after ``ACTION:`` and before the closing; a
    sample counts as right only when the argmax is right at each (TURN_LEFT: ``ĠTURN`` and
    ``_LEFT``; ``ĠTURN`` alone cannot tell left from right)."""
    builder = prompt_builder(load_profile("tiny"))
    prompts = [builder.build(PromptFields("Go to the door.", "Walk ahead.", "A door.", "2 m away.", action), n_images=1)
               for action in ("TURN_LEFT", "STOP")]
    batch = collate_prompts(prompts, builder.pad_token_id)
    labels = batch["labels"]
    spans = ActionSpan.of(builder).positions(batch["segment_ids"])
    assert [builder.tokenizer.decode(labels[b, span]) for b, span in enumerate(spans)] == [" TURN_LEFT", " STOP"]
    assert len(spans[0]) == 2

    vocab = len(builder.tokenizer)
    # The hidden state at t - 1 is the one-hot of the label at t, the head the identity: all right.
    hidden = torch.zeros(*labels.shape, vocab)
    hidden[:, :-1] = F.one_hot(labels[:, 1:].clamp_min(0), vocab).float()
    head = torch.eye(vocab)
    assert action_tokens_correct(hidden, labels, spans, head).tolist() == [True, True]
    wrong = hidden.clone()
    wrong[0, spans[0][-1] - 1] = F.one_hot(torch.tensor(builder.tokenizer.convert_tokens_to_ids("_RIGHT")), vocab)
    assert action_tokens_correct(wrong, labels, spans, head).tolist() == [False, True]
    # A wrong prediction just outside the name (the ':' of the marker) does not count.
    outside = hidden.clone()
    outside[1, spans[1][0] - 2] = 0
    assert action_tokens_correct(outside, labels, spans, head).tolist() == [True, True]
