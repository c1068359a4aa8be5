"""Shared fixtures: a small sample dataset written once per session by our own generator."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers.bases import BASE_CASES, BaseCase
from helpers.built_once import build_once, shared_folder
from janus_core.index import DatasetIndex, build_index
from janus_core.index.cached import INDEX_CACHE_ENV
from janus_core.sample_data import write_sample_data
from pipelines.frozen_imports import frozen_imports

# Session-wide artifacts (a precomputed cache, a trained run) built once and shared by both tiers.
pytest_plugins = ["helpers.shared_caches", "helpers.shared_runs", "helpers.s3_server"]


@pytest.hookimpl(hookwrapper=True)
def pytest_collection() -> Iterator[None]:
    """Collecting imports torch, transformers and DeepSpeed in every test process: with them frozen
    as janus's commands freeze theirs, the full collections during the tests do not walk them."""
    with frozen_imports():
        yield


SAMPLE_EPISODES = 3
SAMPLE_STEPS = 12  # > 9, so the dataset has padded windows (j <= 8) and linspace windows (j > 8)
SAMPLE_SEED = 0


@pytest.fixture(scope="session")
def sample_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Episode-folder root with 3 episodes x 12 frames (640x480 PNG). Read-only: copy to damage it."""
    return build_once(shared_folder(tmp_path_factory, "sample") / "data", lambda root: write_sample_data(
        root, episodes=SAMPLE_EPISODES, steps=SAMPLE_STEPS, seed=SAMPLE_SEED))


@pytest.fixture(scope="module", params=BASE_CASES, ids=str)
def base(request: pytest.FixtureRequest) -> BaseCase:
    """Each base janus supports (:mod:`helpers.bases`): a test that takes it runs once per base."""
    return request.param


@pytest.fixture(scope="session")
def sample_index(sample_dataset: Path) -> DatasetIndex:
    """The index of ``sample_dataset`` with full image checks."""
    return build_index(sample_dataset)


@pytest.fixture
def dataset_copy(sample_dataset: Path, tmp_path: Path) -> Path:
    """A private copy of the sample dataset that a test may damage."""
    return Path(shutil.copytree(sample_dataset, tmp_path / "data"))


# `janus-cache index` and `plan` keep bare datasets' indexes in a user folder; the tests' stay apart,
# in one folder made by the session's first process (its test workers inherit it) and removed with it.
if INDEX_CACHE_ENV not in os.environ:
    os.environ[INDEX_CACHE_ENV] = tempfile.mkdtemp(prefix="janus-test-index-")
    atexit.register(shutil.rmtree, os.environ[INDEX_CACHE_ENV], ignore_errors=True)
