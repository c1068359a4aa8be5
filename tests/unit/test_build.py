"""The builder of a training run's parts (janus_train.build) and the command's
user errors (pipelines.train_start, pipelines.train_run), in this process: the step plan, the data
and its hold-out, the resume choice over a real run directory, the refusal of too little data, and
the one-line messages. Building the model and engine is tests/unit/test_loop_trainer.py."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from helpers.shared_caches import SMALL_SHARDS
from helpers.training import write_train_profile
from janus_core.profile import load_profile
from janus_train.build import prompt_builder, resume_choice, too_few_samples, train_data
from janus_train.checkpoint.elastic import DataLayout, ResumeError
from janus_train.checkpoint.store import Checkpoints, tag_name
from janus_train.config import load_train_settings
from janus_train.data.sources import MixtureError, parse_cache_sources
from janus_train.loop.parts import ResumeChoice, Stepping
from janus_train.loop.progress import Progress
from janus_train.loop.validation import ValidationError
from pipelines.train_run import error_line
from pipelines.train_start import usage_problem


def test_a_step_takes_micro_batch_x_grad_accum_x_world_samples_and_an_epoch_its_whole_steps(tmp_path: Path) -> None:
    settings = load_train_settings(load_profile(str(write_train_profile(
        tmp_path / "p.yaml", train={"micro_batch": 2, "grad_accum": 3, "epochs": 2, "max_steps": 0}))))
    assert Stepping.of(settings, world=2, epoch_length=40) == Stepping(samples_per_step=12, steps_per_epoch=3,
                                                                        total_steps=6)
    assert Stepping.of(replace(settings, max_steps=4), world=2, epoch_length=40).total_steps == 4
    assert Stepping.of(replace(settings, max_steps=99), world=2, epoch_length=40).total_steps == 6
    assert Stepping.of(settings, world=2, epoch_length=11).steps_per_epoch == 0


@pytest.fixture
def tiny_run(small_shards_cache: Callable[[str], Path], tmp_path: Path) -> tuple[Any, Any, Path]:
    """The tiny profile's settings (one episode held out for validation) and the small zarr cache."""
    profile = load_profile(str(write_train_profile(tmp_path / "tiny.yaml", cache=SMALL_SHARDS,
                                                   train={"val_episodes": 1, "val_max_samples": 8})))
    return profile, load_train_settings(profile), small_shards_cache("zarr")


def test_the_data_holds_out_an_episode_and_orders_the_rest(tiny_run: tuple[Any, Any, Path]) -> None:
    profile, settings, cache = tiny_run
    data = train_data(profile, settings, prompt_builder(profile, settings), parse_cache_sources([str(cache)]),
                      None, rank=0, world=1)
    assert not data.streaming
    assert len(data.dataset) == 24 and data.order.epoch_length == 24  # 3 episodes x 12 samples, one held out
    assert data.validation is not None and data.validation.description == "8 samples of 1 held-out episode"
    layout = data.layout(settings, world=1)
    assert (layout.n_samples, layout.samples_per_step, layout.sources) == (24, 2, (("cache", 24, 1.0),))


def test_too_little_data_is_refused_naming_the_cache_and_the_step_size(tiny_run: tuple[Any, Any, Path]) -> None:
    profile, settings, cache = tiny_run
    settings = replace(settings, grad_accum=16)
    data = train_data(profile, settings, prompt_builder(profile, settings), parse_cache_sources([str(cache)]),
                      None, rank=0, world=2)
    stepping = Stepping.of(settings, 2, data.order.epoch_length)
    assert str(too_few_samples(data, settings, 2, stepping)) == (
        f"{cache} holds 24 samples, fewer than one optimizer step takes "
        "(micro_batch 1 x grad_accum 16 x 2 processes = 32)")


def save_deepspeed_like(checkpoints: Checkpoints, step: int, layout: DataLayout) -> None:
    """A checkpoint as DeepSpeed's save leaves it on disk (the client state inside rank 0's model
    states), recorded and named by ``latest`` as the trainer's save does."""

    class Engine:
        def save_checkpoint(self, directory: str, tag: str, client_state: dict[str, Any], save_latest: bool) -> None:
            torch.save({"module": {}, **client_state}, Path(directory) / tag / "mp_rank_00_model_states.pt")

    state = Progress(step=step, epoch=0, position=step * layout.samples_per_step).client_state(layout, rng={}, lr_schedule={})
    checkpoints.save(Engine(), tag_name(step), state, keep=2)


def test_a_fresh_run_keeps_its_settings_and_resumes_nothing(tmp_path: Path, tiny_run: tuple[Any, Any, Path]) -> None:
    _, settings, _ = tiny_run
    assert resume_choice(Checkpoints(tmp_path / "run" / "checkpoints"), settings, world=1) == (settings, ResumeChoice())


def test_a_resume_on_fewer_processes_adapts_grad_accum_to_the_checkpoints_global_batch(
        tmp_path: Path, tiny_run: tuple[Any, Any, Path]) -> None:
    _, settings, _ = tiny_run
    checkpoints = Checkpoints(tmp_path / "run" / "checkpoints")
    saved = DataLayout(world=2, micro_batch=1, grad_accum=2, n_samples=24, seed=0, streaming=False,
                       sources=(("cache", 24, 1.0),))
    save_deepspeed_like(checkpoints, 3, saved)
    adapted, choice = resume_choice(checkpoints, settings, world=1)
    assert choice.chosen is not None and choice.chosen.tag == tag_name(3)
    assert adapted.grad_accum == 4 and adapted == replace(settings, grad_accum=4)
    assert choice.grad_accum_note == (f"note: grad_accum 4 instead of the profile's 2 on 1 process keeps the global "
                                      f"batch of checkpoint {tag_name(3)} (1 x 2 x 2 processes = 4 samples); "
                                      "train.resume_grad_accum: keep refuses such a resume instead")
    kept, choice = resume_choice(checkpoints, replace(settings, resume_grad_accum="keep"), world=1)
    assert kept.grad_accum == 2 and choice.grad_accum_note is None


def test_a_user_error_is_its_own_line_and_a_validation_source_names_the_profile(
        tiny_run: tuple[Any, Any, Path]) -> None:
    profile, _, _ = tiny_run
    assert error_line(ValidationError("the validation set is empty"), profile) == \
        f"{profile.source}: the validation set is empty"
    for err in (ResumeError("cannot resume"), MixtureError("bad weights")):
        assert error_line(err, profile) == str(err)


def test_options_that_do_not_go_together_are_named() -> None:
    assert usage_problem(None, None, None) == "give exactly one of --cache or --live-data"
    assert usage_problem(["c"], Path("d"), None) == "give exactly one of --cache or --live-data"
    assert usage_problem(["a", "b"], None, "data").startswith("--data checks one --cache against its dataset")
    assert usage_problem(["c"], None, "data") is None
