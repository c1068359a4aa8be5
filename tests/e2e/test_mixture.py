"""Several caches with sampling weights (the trainer's half): the global sample sequence
draws each cache in proportion to its weight, deterministically, resumably at any global position
and on any number of ranks; ``--cache NAME=PATH:WEIGHT`` names the caches; a real two-process run
trains on two real zarr caches in the proportions asked for. The sequence and the argument parsing
as functions: tests/unit/test_mixture_order.py."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import yaml

from helpers.profiles import write_test_profile
from helpers.training import train_on_ranks
from janus_core.sample_data import write_sample_data
from janus_train.data.mixture import Mixture

# ----------------------------------------------------------------------------------------------
# 2-process runs (torch's elastic agent, helpers.training.train_on_ranks) on two real caches


@pytest.fixture(scope="module")
def two_caches(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """Two real zarr caches of different sample data (6 and 10 samples) and a training profile:
    micro-batch 1 x accumulation 2 x 2 processes = 4 samples per step, sample keys logged."""
    from pipelines.precompute_run import Options, run

    root = tmp_path_factory.mktemp("mixture")
    profile = write_test_profile(root / "p.yaml", cache={"feature_dtype": "float32"})
    data = yaml.safe_load(profile.read_text())
    data["train"].update({"micro_batch": 1, "grad_accum": 2, "epochs": 100, "max_steps": 6, "warmup_ratio": 0.0,
                          "save_every": 3, "save_total_limit": 10, "log_every": 1, "num_workers": 0,
                          "log_sample_keys": True, "lr_base": 2e-3, "lr_projector": 2e-3})
    profile.write_text(yaml.safe_dump(data, sort_keys=False))
    caches = []
    for name, (episodes, steps, seed) in {"a": (2, 3, 1), "b": (2, 5, 2)}.items():
        source = write_sample_data(root / f"data-{name}", episodes=episodes, steps=steps, seed=seed)
        assert run(Options(source, root / name, profile=str(profile), workers=1)) == 0
        caches.append(root / name)
    return caches[0], caches[1], profile


def test_two_processes_train_on_a_weighted_mixture_of_two_caches_and_resume_it_exactly(
        two_caches: tuple[Path, Path, Path], tmp_path: Path) -> None:
    """16 samples (6 + 10) weighted a=3, b=1: every epoch draws 12 of a and 4 of b (a's 6 twice),
    4 steps per epoch. Six steps of 4 samples read exactly the mixture's sequence, with the
    source named in every key; a run resumed from the step-3 checkpoint (mid-epoch) reads steps
    4..6 as the uninterrupted run does, with the same losses."""
    cache_a, cache_b, profile = two_caches
    args = ["--cache", f"a={cache_a}:3", "--cache", f"b={cache_b}:1", "--profile", profile, "--no-export"]
    out = tmp_path / "run"
    result = train_on_ranks("--out", out, *args)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "from a (weight 3), b (weight 1)" in result.stdout
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    keys = [key for r in records for key in r["sample_keys"]]
    assert [len(r["sample_keys"]) for r in records] == [4] * 6

    mixture = Mixture((6, 10), (3, 1), seed=0)
    assert mixture.draws() == [12, 4]
    names = {"a": sorted(k for k in keys if k.startswith("a/")), "b": sorted(k for k in keys if k.startswith("b/"))}
    assert len(names["a"]) + len(names["b"]) == len(keys)
    # The first epoch (steps 1..4) draws a 12 times (each of its 6 samples twice) and b 4 times.
    epoch0 = keys[:16]
    assert Counter(k.split("/")[0] for k in epoch0) == {"a": 12, "b": 4}
    assert set(Counter(k for k in epoch0 if k.startswith("a/")).values()) == {2}
    # Exactly the sequence's sources, in order.
    sequence = mixture.epoch_sequence(0) + mixture.epoch_sequence(1)
    assert [k.split("/")[0] for k in keys] == ["a" if i < 6 else "b" for i in sequence[:24]]

    resumed = tmp_path / "resumed"
    (resumed / "checkpoints").mkdir(parents=True)
    tag = "step00000003"
    import shutil

    shutil.copytree(out / "checkpoints" / tag, resumed / "checkpoints" / tag)
    (resumed / "checkpoints" / "latest").write_text(tag)
    result = train_on_ranks("--out", resumed, *args)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "resumed at step 3 (epoch 0, sample 12 of the epoch)" in result.stdout
    again = [json.loads(line) for line in (resumed / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in again] == [4, 5, 6]
    for got, want in zip(again, records[3:]):
        assert got["sample_keys"] == want["sample_keys"]
        assert got["loss"] == pytest.approx(want["loss"], rel=1e-6)

    # Weights that differ from the checkpoint's are refused in one line, before any model is built.
    changed = train_on_ranks("--out", resumed, "--cache", f"a={cache_a}:1", "--cache", f"b={cache_b}:1",
                             "--profile", profile, "--no-export")
    assert changed.returncode != 0
    error = [line for line in changed.stderr.splitlines() if line.startswith("error:")]
    assert len(error) == 1 and "the caches differ (checkpoint a=6:3, b=10:1; now a=6:1, b=10:1)" in error[0]
    assert "janus_train/" not in changed.stderr  # no traceback from the ranks


def test_caches_that_do_not_match_the_profile_or_a_bad_cache_argument_are_refused_in_one_line(
        two_caches: tuple[Path, Path, Path], tmp_path: Path) -> None:
    cache_a, _, profile = two_caches
    bad = train_on_ranks("--out", tmp_path / "run", "--cache", f"a={cache_a}:3", "--cache",
                         f"b={tmp_path / 'none'}:1", "--profile", profile, nproc=1)
    assert bad.returncode != 0 and "cache 'b'" in bad.stderr and "janus_train/" not in bad.stderr
    weightless = train_on_ranks("--out", tmp_path / "run", "--cache", f"a={cache_a}", "--profile", profile, nproc=1)
    assert weightless.returncode != 0 and "NAME=PATH:WEIGHT" in weightless.stderr
