"""Helpers shared by several test modules (moved from tests/test_first_use.py)."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from helpers.training import (
    assert_succeeded,
    precompute,
    torchrun_train,
    write_train_profile,
)
from janus_cache.sample_data import write_sample_data

JANUS_TRAIN = Path(sys.executable).parent / "janus-train"


RESOLUTION = "pad56"  # small frames: the point is the files, not the numbers


@dataclass(frozen=True)
class TinyRun:
    profile: Path
    cache: Path
    run: Path


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> TinyRun:
    """Two ZeRO-3 steps of the tiny profile (torchrun, 2 processes) with a checkpoint at the end."""
    root = tmp_path_factory.mktemp("first-use")
    profile = write_train_profile(root / "tiny.yaml", cache={"resolution": RESOLUTION},
                                  train={"max_steps": 2, "save_every": 2, "live_check_every": 0})
    cache = precompute(write_sample_data(root / "data", episodes=2, steps=4, seed=0), root / "cache", profile)
    run = root / "run"
    assert_succeeded(torchrun_train("--out", run, "--cache", cache, "--profile", profile, "--no-export"))
    return TinyRun(profile, cache, run)

