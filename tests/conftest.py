"""Shared fixtures: a small sample dataset written once per session by our own generator."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from janus_cache.index import DatasetIndex, build_index
from janus_cache.sample_data import write_sample_data

SAMPLE_EPISODES = 3
SAMPLE_STEPS = 12  # > 9, so the dataset has padded windows (j <= 8) and linspace windows (j > 8)
SAMPLE_SEED = 0


@pytest.fixture(scope="session")
def sample_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Episode-folder root with 3 episodes x 12 frames (640x480 PNG). Read-only: copy to damage it."""
    root = tmp_path_factory.mktemp("sample") / "data"
    return write_sample_data(root, episodes=SAMPLE_EPISODES, steps=SAMPLE_STEPS, seed=SAMPLE_SEED)


@pytest.fixture(scope="session")
def sample_index(sample_dataset: Path) -> DatasetIndex:
    """The index of ``sample_dataset`` with full image checks."""
    return build_index(sample_dataset)


@pytest.fixture
def dataset_copy(sample_dataset: Path, tmp_path: Path) -> Path:
    """A private copy of the sample dataset that a test may damage."""
    return Path(shutil.copytree(sample_dataset, tmp_path / "data"))


# ---------------------------------------------------------------------------------------------
# Helpers for tests that run whole stages (profiles outside the repo, comparing cache trees)

REPO_ROOT = Path(__file__).resolve().parents[1]
TINY_PROFILE = REPO_ROOT / "configs" / "profiles" / "tiny.yaml"


VALIDATION_SETTINGS = ("val_cache", "val_episodes", "val_episodes_fraction", "val_max_samples", "eval_every",
                       "best_metric")


def write_test_profile(path: Path, cache: dict | None = None, vggt: dict | None = None,
                       keep_validation: bool = False) -> Path:
    """A copy of the tiny profile at ``path`` with absolute model paths and ``cache``/``vggt`` overrides.

    Model paths in a profile are relative to the YAML file, so a copy elsewhere needs them absolute.
    """
    import yaml

    data = yaml.safe_load(TINY_PROFILE.read_text())
    for section, key in (("vggt", "config"), ("vggt", "path"), ("qwen", "path")):
        if data[section].get(key) is not None:
            data[section][key] = str((TINY_PROFILE.parent / data[section][key]).resolve())
    # The stage tests count on training over every sample: the tiny profile's validation hold-out
    # is left out unless asked for (tests/test_validation.py).
    if not keep_validation:
        for name in VALIDATION_SETTINGS:
            data["train"].pop(name, None)
    data["cache"].update(cache or {})
    data["vggt"].update(vggt or {})
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def file_digests(root: Path) -> dict[str, str]:
    """sha256 of every file under ``root``, keyed by its path relative to ``root``; a cache's stored
    dataset index (``index/``, a memo of the dataset's files, not cache content) is left out."""
    import hashlib

    from janus_cache.store.layout import INDEX_STORE_DIR

    return {
        rel: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not (rel := p.relative_to(root).as_posix()).startswith(INDEX_STORE_DIR + "/")
    }


# DeepSpeed JIT-builds its CPU communication op once; reuse the build inside the environment (as
# the Makefile does) instead of compiling it in every test that starts a training process.
import os  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402

os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(Path(sys.prefix) / "torch_extensions"))
# `janus-cache index` and `plan` keep bare datasets' indexes in a user folder; the tests' stay apart.
os.environ.setdefault("JANUS_INDEX_CACHE", tempfile.mkdtemp(prefix="janus-test-index-"))
