"""Training never consumes damaged cache data: it stops naming the file and sample, or skips and counts.

Real caches of 2 episodes x 4 steps (tiny profile, one sample per feature shard), damaged after
precompute the way a disk does (one flipped byte), which the trainer's start-up check (shard
presence and size, no hashing) lets through: the damage is found when the sample is read.

The runs: real torchrun, 2 processes, DeepSpeed ZeRO-3 over gloo; micro-batch 1, gradient
accumulation 2, so a step takes 4 samples and an epoch of 8 samples is 2 steps. The damaged
sample is rank 1's first micro-batch of step 2.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import write_test_profile
from test_train import assert_succeeded, torchrun_train

from janus_cache.profile import load_profile
from janus_cache.sample_data import write_sample_data
from janus_cache.store.layout import wds_shard_name
from janus_cache.store.wds_store import encode_key
from janus_train.data import EpochSampler
from janus_train.trainer import CHECKPOINTS, METRICS_FILE, open_training_cache
from pipelines.precompute import Options, run

N_PROC, PER_RANK_STEP, N_SAMPLES = 2, 2, 8
MAX_STEPS = 4
DAMAGED_RANK, DAMAGED_STEP = 1, 2


@dataclass(frozen=True)
class Damaged:
    profile: Path
    cache: Path
    file: Path
    key: str
    row: int


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


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("damage-training")
    return root, write_sample_data(root / "data", episodes=2, steps=4, seed=0)


@pytest.fixture(scope="module")
def damaged_zarr(workdir: tuple[Path, Path]) -> Damaged:
    root, data = workdir
    profile = write_profile(root / "stop.yaml")
    cache = root / "zarr"
    assert run(Options(data, cache, str(profile), workers=1)) == 0
    reader = open_training_cache(load_profile(profile), cache).reader
    assert len(reader) == N_SAMPLES
    row = EpochSampler(N_SAMPLES, DAMAGED_RANK, N_PROC, seed=0, epoch=0).rows()[PER_RANK_STEP]
    key = reader.sample(row).key
    file = reader.shard_file(reader.features_array, row)  # one sample per shard
    flip_byte(file, 20)
    return Damaged(profile, cache, file, key, row)


def records(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / METRICS_FILE).read_text().splitlines()]


def error_lines(result: Any) -> list[str]:
    return [line for line in (result.stdout + result.stderr).splitlines() if line.startswith("error:")]


def test_the_damage_passes_the_start_up_check_and_is_found_on_read(damaged_zarr: Damaged) -> None:
    from pipelines.train import cache_refusal

    assert cache_refusal(damaged_zarr.cache, load_profile(damaged_zarr.profile)) is None


def test_a_deleted_shard_is_refused_by_the_start_up_check_naming_it(damaged_zarr: Damaged, tmp_path: Path) -> None:
    import shutil

    from pipelines.train import cache_refusal

    cache = Path(shutil.copytree(damaged_zarr.cache, tmp_path / "cache"))
    missing = cache / damaged_zarr.file.relative_to(damaged_zarr.cache)
    missing.unlink()
    refusal = cache_refusal(cache, load_profile(damaged_zarr.profile))
    assert refusal is not None and str(missing) in refusal


def test_an_edited_endian_is_refused_by_the_start_up_check_naming_the_zarr_json(
    damaged_zarr: Damaged, tmp_path: Path,
) -> None:
    """Before: 20 steps of ``loss nan`` and exit 0 (every bf16 feature read byte-swapped)."""
    import shutil

    from pipelines.train import cache_refusal

    cache = Path(shutil.copytree(damaged_zarr.cache, tmp_path / "cache"))
    reader = open_training_cache(load_profile(damaged_zarr.profile), damaged_zarr.cache).reader
    meta = cache / reader.features_array / "zarr.json"
    meta.write_text(meta.read_text().replace('"little"', '"big"'))
    refusal = cache_refusal(cache, load_profile(damaged_zarr.profile))
    assert refusal is not None and f"{meta} differs from the sha256 recorded" in refusal, refusal


def test_a_damaged_sample_stops_every_rank_naming_the_shard_file_and_the_sample(
    damaged_zarr: Damaged, tmp_path: Path,
) -> None:
    out = tmp_path / "run"
    result = torchrun_train("--out", out, "--cache", damaged_zarr.cache, "--profile", damaged_zarr.profile,
                            "--no-export")
    output = (result.stdout + result.stderr).splitlines()
    assert result.returncode == 1, "\n".join(output)
    reports = error_lines(result)
    assert len(reports) == 1, "\n".join(output)
    assert reports[0].startswith(f"error: step {DAMAGED_STEP}, rank {DAMAGED_RANK}: damaged cache data: "
                                 f"{damaged_zarr.file}: checksum mismatch (crc32c) (read for sample {damaged_zarr.key})")
    assert "janus_cache/store" not in result.stderr  # no traceback through the reader
    # Nothing of the damaged step was trained or saved.
    assert (out / CHECKPOINTS / "latest").read_text().strip() == "step00000001"
    assert [r["step"] for r in records(out)] == [1]


def damaged_draws(row: int, step: int) -> int:
    """How often the ranks' loaders have drawn ``row`` by the end of ``step`` when each damaged draw
    is left out and the micro-batch taken from the next row (``damaged_samples: skip``)."""
    total = 0
    for rank in range(N_PROC):
        rows = itertools.chain.from_iterable(
            EpochSampler(N_SAMPLES, rank, N_PROC, seed=0, epoch=epoch).rows() for epoch in itertools.count())
        good = 0
        while good < step * PER_RANK_STEP:
            if next(rows) == row:
                total += 1
            else:
                good += 1
    return total


def test_with_skip_the_run_leaves_damaged_samples_out_and_counts_them(damaged_zarr: Damaged, tmp_path: Path) -> None:
    profile = write_profile(tmp_path / "skip.yaml", damaged_samples="skip")
    out = tmp_path / "run"
    result = torchrun_train("--out", out, "--cache", damaged_zarr.cache, "--profile", profile, "--no-export")
    assert_succeeded(result)
    assert not error_lines(result)
    logged = records(out)
    assert [r["step"] for r in logged] == list(range(1, MAX_STEPS + 1))
    assert [r["damaged_skips"] for r in logged] == [damaged_draws(damaged_zarr.row, s) for s in range(1, MAX_STEPS + 1)]
    assert logged[-1]["damaged_skips"] >= 1
    line = next(line for line in result.stdout.splitlines() if line.startswith(f"step {MAX_STEPS}/{MAX_STEPS}"))
    assert f"| damaged samples skipped {logged[-1]['damaged_skips']}" in line


def test_a_flipped_action_digit_in_a_tar_stops_naming_the_tar_and_the_sample(
    workdir: tuple[Path, Path], tmp_path: Path,
) -> None:
    """Read by 2 DataLoader worker processes per rank: the error crosses them intact."""
    root, data = workdir
    profile = write_profile(root / "wds.yaml", num_workers=2)
    cache = root / "wds"
    assert run(Options(data, cache, str(profile), cache_format="wds", workers=1)) == 0
    reader = open_training_cache(load_profile(profile), cache).reader
    tar = reader.root / reader.array / wds_shard_name(0)  # rank 0's first shard: sample row 0
    key = next(iter(reader.shard(0))).key
    content = tar.read_bytes()
    at = content.index(b'"action": ', content.index(f"{encode_key(key)}.json".encode())) + len(b'"action": ')
    digit = content[at:at + 1]
    tar.write_bytes(content[:at] + (b"1" if digit != b"1" else b"2") + content[at + 1:])

    out = tmp_path / "run"
    result = torchrun_train("--out", out, "--cache", cache, "--profile", profile, "--no-export")
    assert result.returncode == 1, result.stdout + result.stderr
    reports = error_lines(result)
    assert len(reports) == 1 and f"{tar}: member {encode_key(key)}.json fails its crc32c" in reports[0], reports
    assert f"(read for sample {key})" in reports[0]
    assert not (out / CHECKPOINTS / "latest").exists()
