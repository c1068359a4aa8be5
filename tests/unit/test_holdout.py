"""Validation's hold-out and small parts, in this process: held-out episodes
are whole, disjoint from training and chosen by seed, live data holds out the same ones, unusable
hold-outs and two validation sources are refused in one line, and the best-metric order, the step
line's validation and the action-token accuracy (the runs that validate are
tests/e2e/test_validation.py).

The data: the session's 3 episodes x 4 steps and their bfloat16 cache (helpers.shared_runs).
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import yaml

from helpers.shared_runs import TinyTraining
from helpers.validation import EPISODES, STEPS, VAL_SAMPLES, profile_with, validation_data, validation_of
from janus_core.index import build_index
from janus_core.profile import ProfileError, load_profile
from janus_core.resolution import Resolution
from janus_train.build import prompt_builder
from janus_train.config import load_train_settings
from janus_train.data.from_profile import open_training_cache
from janus_train.data.holdout import HoldoutError, heldout_count, split_by_episode
from janus_train.data.prompt import PromptFields, collate_prompts
from janus_train.data.samples import CachedSamples, LiveSamples
from janus_train.data.val_metric_names import BEST_METRICS, better
from janus_train.loop.logs import step_line
from janus_train.loop.validation import ActionSpan, ValidationError, action_tokens_correct, episode_ids, plan_validation


@pytest.fixture
def built(three_episodes: TinyTraining, tmp_path: Path) -> dict[str, Path]:
    return validation_data(three_episodes, tmp_path)


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
