"""Damaged cache data in a mixture of caches (``--cache NAME=PATH:WEIGHT``, ``make train MIXTURE=...``)
ends training with the same one line as one cache does, naming the damaged file of the cache it is
in and the sample under its mixture key (``b/<key>``), or is skipped and counted under
``train.damaged_samples: skip``; for training draws and for the held-out validation rows alike.

The mixture puts its cache's name before a damaged item's key too (its key a property of the error,
which ``dataclasses.replace`` would refuse with a TypeError: a traceback from the loader instead of
the one line).

Two real zarr caches of 2 episodes x 4 steps (tiny profile, one sample per feature shard; the
session's, helpers.shared_runs), a byte flipped in a copy of cache ``b``. Here the launch; the
trainer's step drawing and validation reads in one process: tests/unit/test_mixture_damage_reads.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers.damage import copies, error_lines, flip_byte, write_profile
from helpers.shared_runs import OneSampleShards
from helpers.training import train_on_ranks
from janus_cache.store.layout import SAMPLES_TABLE, TEXT_PAYLOAD, table_group
from janus_core.profile import load_profile
from janus_train.data.from_profile import open_training_cache
from janus_train.run.layout import CHECKPOINTS_DIR


@pytest.fixture(scope="module")
def clean_caches(one_sample_shards: OneSampleShards) -> tuple[Path, Path, Path]:
    """(profile, cache a, cache b): the session's two intact zarr caches of different sample data, read-only."""
    return one_sample_shards.profile, one_sample_shards.cache("a"), one_sample_shards.cache("b")


def test_a_mixture_run_reading_a_damaged_table_column_ends_every_rank_with_one_line(
    clean_caches: tuple[Path, Path, Path], tmp_path: Path,
) -> None:
    """``make train MIXTURE="a=A:1 b=B:1"``'s launcher, 2 processes, 2 loader workers each, holding out an
    episode per cache as the shipped profiles do; every sample of cache b reads the damaged column."""
    profile = write_profile(tmp_path / "profile.yaml", num_workers=2, val_episodes=1)
    a, b = copies(clean_caches, tmp_path)
    reader = open_training_cache(load_profile(profile), b).reader
    file = reader.shard_file(f"{table_group(SAMPLES_TABLE)}/description_2d/{TEXT_PAYLOAD}", 0)
    flip_byte(file, 0)

    out = tmp_path / "run"
    result = train_on_ranks("--out", out, "--cache", f"a={a}:1", "--cache", f"b={b}:1", "--profile", profile,
                          "--no-export")
    assert result.returncode == 1, result.stdout + result.stderr
    reports = error_lines(result)
    assert len(reports) == 1, result.stdout + result.stderr
    assert reports[0].startswith("error: step 1, rank ") and f": damaged cache data: {file}: checksum mismatch" in (
        reports[0]), reports
    assert "(read for sample b/" in reports[0]
    assert "Traceback" not in result.stdout + result.stderr
    assert not (out / CHECKPOINTS_DIR / "latest").exists()
