"""Several caches with sampling weights (the trainer's half), in one process: the global
sample sequence draws each cache in proportion to its weight, deterministically, resumably at any
global position and on any number of ranks, and ``--cache NAME=PATH:WEIGHT`` arguments parse to
weighted sources or one-line errors (real two-process runs on two caches: tests/e2e/test_mixture.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from janus_cache.store.split import epoch_order, merge_rank_shares, rank_share_from
from janus_train.data.mixture import Mixture, largest_remainder
from janus_train.data.sources import CacheSource, MixtureError, parse_cache_sources


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
