"""Damaged caches for the tests: byte flips in a chosen array, the damage tests' profile and their
sample order."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from helpers.profiles import write_test_profile

N_PROC = 2  # the ranks of a launched training


MAX_STEPS = 4


def write_profile(path: Path, **train: object) -> Path:
    write_test_profile(path, cache={"samples_per_shard": 1})
    data = yaml.safe_load(path.read_text())
    data["train"].update({"epochs": 100, "max_steps": MAX_STEPS, "save_every": 1, "save_total_limit": 10,
                          "log_every": 1, "warmup_ratio": 0.0, **train})
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def flip_byte(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 1
    path.write_bytes(bytes(data))


def error_lines(result: Any) -> list[str]:
    return [line for line in (result.stdout + result.stderr).splitlines() if line.startswith("error:")]


class OneProcess:
    """The collective of a single process (what draw_step agrees through, without a process group)."""

    def sum(self, values: list[float]) -> list[float]:
        return list(values)

    def gather(self, value: Any) -> list[Any]:
        return [value]


def copies(clean_caches: tuple[Path, Path, Path], dest: Path) -> tuple[Path, Path]:
    """Writable copies of caches a and b of ``(profile, a, b)`` under ``dest``."""
    import shutil

    _, a, b = clean_caches
    return Path(shutil.copytree(a, dest / "a")), Path(shutil.copytree(b, dest / "b"))


# The damaged caches of the training tests (tests/unit/test_damaged_reads.py, tests/e2e/test_damage_training.py):
# 2 episodes x 4 steps, one sample per feature shard; micro-batch 1, gradient accumulation 2 on 2
# ranks, so a step takes 4 samples and an epoch of 8 samples is 2 steps. The damaged sample is rank
# 1's first micro-batch of step 2.
PER_RANK_STEP, N_SAMPLES = 2, 8
DAMAGED_RANK, DAMAGED_STEP = 1, 2
TEXT_COLUMNS = ("key", "source", "instruction", "subinstruction", "description_2d", "description_3d", "episode_id")
NUMERIC_COLUMNS = ("action", "step", "window_rows")


def sample_table_arrays() -> tuple[str, ...]:
    """Every array of a cache's samples table, ``column[/part]``."""
    from janus_cache.store.layout import TEXT_OFFSETS, TEXT_PAYLOAD

    return (*(f"{c}/{part}" for c in TEXT_COLUMNS for part in (TEXT_PAYLOAD, TEXT_OFFSETS)), *NUMERIC_COLUMNS)


SAMPLE_TABLE_ARRAYS = sample_table_arrays()
DAMAGE_TARGETS = (*SAMPLE_TABLE_ARRAYS, "frames", "features")


def training_order() -> Any:
    """The trainer's sample order of the cache (seed 0)."""
    from janus_train.data.mixture import Mixture

    return Mixture((N_SAMPLES,), (1.0,), seed=0)


@dataclass(frozen=True)
class Damaged:
    profile: Path
    cache: Path
    file: Path
    key: str
    row: int


def damage_the_drawn_feature(profile: Path, clean: Path, dest: Path) -> Damaged:
    """A copy of ``clean`` at ``dest`` with one byte flipped in the feature shard of the sample rank
    ``DAMAGED_RANK`` draws first in step ``DAMAGED_STEP``."""
    import shutil

    from janus_core.profile import load_profile
    from janus_train.data.from_profile import open_training_cache

    cache = Path(shutil.copytree(clean, dest))
    reader = open_training_cache(load_profile(profile), cache).reader
    assert len(reader) == N_SAMPLES
    row = training_order().rank_rows(0, DAMAGED_RANK, N_PROC)[PER_RANK_STEP]
    key = reader.sample(row).key
    file = reader.shard_file(reader.features_array, row)  # one sample per shard
    flip_byte(file, 20)
    return Damaged(profile, cache, file, key, row)


def damaged_copy(clean_zarr: tuple[Path, Path], target: str, dest: Path) -> tuple[Path, Path]:
    """(cache, file): a copy of the clean cache with one byte flipped in the first shard of ``target``
    (a samples-table array ``column[/part]``, ``frames`` or ``features``)."""
    import shutil

    from janus_cache.store.layout import SAMPLES_TABLE, table_group
    from janus_core.profile import load_profile
    from janus_train.data.from_profile import open_training_cache

    profile, clean = clean_zarr
    cache = Path(shutil.copytree(clean, dest))
    reader = open_training_cache(load_profile(profile), cache).reader
    array = {"frames": reader.frames_array, "features": reader.features_array}.get(
        target, f"{table_group(SAMPLES_TABLE)}/{target}")
    file = reader.shard_file(array, 0)
    flip_byte(file, 0)
    return cache, file
