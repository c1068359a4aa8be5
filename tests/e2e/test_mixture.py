"""Several caches with sampling weights (issue 14 item 3, trainer half): the global sample sequence
draws each cache in proportion to its weight, deterministically, resumably at any global position
and on any number of ranks; ``--cache NAME=PATH:WEIGHT`` names the caches; a real two-process run
trains on two real zarr caches in the proportions asked for."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import yaml
from helpers.profiles import REPO_ROOT, write_test_profile

from janus_cache.sample_data import write_sample_data
from janus_cache.store.split import epoch_order, merge_rank_shares, rank_share_from
from janus_train.mixture import CacheSource, Mixture, MixtureError, largest_remainder, parse_cache_sources

TIMEOUT_S = 600


# ----------------------------------------------------------------------------------------------
# the sequence


def test_one_source_is_the_plain_epoch_permutation() -> None:
    for weight in (1.0, 0.3):
        assert Mixture((11,), (weight,), seed=3).epoch_sequence(2) == epoch_order(11, 3, 2)


def test_each_epoch_draws_every_source_in_proportion_to_its_weight() -> None:
    """Sizes 40 and 60 (epoch length 100) drawn 0.7 / 0.3: 70 and 30 per epoch, every epoch; the
    under-weighted source's samples are distinct within an epoch and its next epoch continues its
    pass (no sample again before all were drawn); the over-weighted one repeats only after a whole
    pass over its 40."""
    mixture = Mixture((40, 60), (0.7, 0.3), seed=0)
    assert mixture.epoch_length == 100 and mixture.draws() == [70, 30]
    seen_a: list[int] = []
    seen_b: list[int] = []
    for epoch in range(4):
        sequence = mixture.epoch_sequence(epoch)
        assert len(sequence) == 100
        a = [i for i in sequence if i < 40]
        b = [i - 40 for i in sequence if i >= 40]
        assert (len(a), len(b)) == (70, 30)
        seen_a += a
        seen_b += b
        # Prefixes keep the proportion too (the interleave is a shuffle, not blocks).
        assert 0.5 < sum(i < 40 for i in sequence[:50]) / 50 < 0.9
    # Each source's draws, over the epochs, are whole passes one after another.
    assert all(sorted(seen_a[p * 40:(p + 1) * 40]) == list(range(40)) for p in range(7))
    assert all(sorted(seen_b[p * 60:(p + 1) * 60]) == list(range(60)) for p in range(2))
    assert seen_a[:40] != seen_a[40:80]  # each pass its own permutation
    # Weights of any scale mean the same; another seed gives another sequence.
    assert Mixture((40, 60), (7, 3), seed=0).epoch_sequence(1) == mixture.epoch_sequence(1)
    assert Mixture((40, 60), (0.7, 0.3), seed=1).epoch_sequence(1) != mixture.epoch_sequence(1)


def test_largest_remainder_counts_sum_to_the_total_each_within_one_of_its_share() -> None:
    for weights, total in (((1, 1, 1), 10), ((0.7, 0.3), 7), ((5, 1e-3), 3), ((0.2, 0.2, 0.6), 101)):
        counts = largest_remainder(weights, total)
        assert sum(counts) == total
        assert all(abs(c - w / sum(weights) * total) < 1 for c, w in zip(counts, weights))


def test_a_resumed_run_on_any_world_continues_the_exact_sequence() -> None:
    """The sequence depends only on (sizes, weights, seed, epoch): a run that stopped after ``k``
    steps of 12 samples and resumes at global position 12k on 3 ranks (instead of 2) reads, step
    by step, exactly the samples the uninterrupted run reads."""
    mixture = Mixture((13, 29), (0.25, 0.75), seed=7)
    sequence = mixture.epoch_sequence(5)
    assert Mixture((13, 29), (0.25, 0.75), seed=7).epoch_sequence(5) == sequence  # a fresh process
    step = 12
    for world in (1, 2, 3, 4):
        for k in range(len(sequence) // step):
            shares = [rank_share_from(sequence, r, world, start=k * step, stop=(k + 1) * step) for r in range(world)]
            assert merge_rank_shares(shares) == sequence[k * step:(k + 1) * step]


def test_cache_arguments_parse_to_weighted_sources_and_bad_ones_are_one_line_errors() -> None:
    assert parse_cache_sources(["caches/r2r"]) == [CacheSource("r2r", Path("caches/r2r"), 1.0)]
    assert parse_cache_sources(["r2r=/d/c:1:0.7", "rxr=b:3"]) == [
        CacheSource("r2r", Path("/d/c:1"), 0.7), CacheSource("rxr", Path("b"), 3.0)]
    for bad, says in ((["r2r=a"], "NAME=PATH:WEIGHT"), (["r2r=a:x"], "not a number"), (["r2r=a:0"], "positive"),
                      (["r2r=a:-1"], "positive"), (["a", "rxr=b:1"], "several caches"),
                      (["r=a:1", "r=b:1"], "given twice"), (["r2r=a:nan"], "positive")):
        with pytest.raises(MixtureError, match=says) as err:
            parse_cache_sources(bad)
        assert "\n" not in str(err.value)


# ----------------------------------------------------------------------------------------------
# through torchrun on two real caches


def torchrun(*args: str | Path, nproc: int = 2) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
               "-m", "pipelines.train", *map(str, args)]
    return subprocess.run(command, cwd=REPO_ROOT, env=dict(os.environ), capture_output=True, text=True,
                          check=False, timeout=TIMEOUT_S)


@pytest.fixture(scope="module")
def two_caches(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """Two real zarr caches of different sample data (6 and 10 samples) and a training profile:
    micro-batch 1 x accumulation 2 x 2 processes = 4 samples per step, sample keys logged."""
    from pipelines.precompute import Options, run

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
    result = torchrun("--out", out, *args)
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
    result = torchrun("--out", resumed, *args)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "resumed at step 3 (epoch 0, sample 12 of the epoch)" in result.stdout
    again = [json.loads(line) for line in (resumed / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in again] == [4, 5, 6]
    for got, want in zip(again, records[3:]):
        assert got["sample_keys"] == want["sample_keys"]
        assert got["loss"] == pytest.approx(want["loss"], rel=1e-6)

    # Weights that differ from the checkpoint's are refused in one line, before any model is built.
    changed = torchrun("--out", resumed, "--cache", f"a={cache_a}:1", "--cache", f"b={cache_b}:1",
                       "--profile", profile, "--no-export")
    assert changed.returncode != 0
    error = [line for line in changed.stderr.splitlines() if line.startswith("error:")]
    assert len(error) == 1 and "the caches differ (checkpoint a=6:3, b=10:1; now a=6:1, b=10:1)" in error[0]
    assert "janus_train/" not in changed.stderr  # no traceback from the ranks


def test_caches_that_do_not_match_the_profile_or_a_bad_cache_argument_are_refused_in_one_line(
        two_caches: tuple[Path, Path, Path], tmp_path: Path) -> None:
    cache_a, _, profile = two_caches
    bad = torchrun("--out", tmp_path / "run", "--cache", f"a={cache_a}:3", "--cache", f"b={tmp_path / 'none'}:1",
                   "--profile", profile, nproc=1)
    assert bad.returncode != 0 and "cache 'b'" in bad.stderr and "janus_train/" not in bad.stderr
    weightless = torchrun("--out", tmp_path / "run", "--cache", f"a={cache_a}", "--profile", profile, nproc=1)
    assert weightless.returncode != 0 and "NAME=PATH:WEIGHT" in weightless.stderr
