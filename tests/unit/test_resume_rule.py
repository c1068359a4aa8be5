"""Elastic resume's rule, as a function: the split over processes may change
(zarr); the global batch, the data and a streaming cache's world may not (the runs that resume on
another world for real are tests/e2e/test_elastic_resume.py)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from janus_train.checkpoint.elastic import DataLayout, ResumeError, check_resumable


def saved_state(world: int, micro_batch: int, grad_accum: int, streaming: bool) -> dict[str, Any]:
    layout = DataLayout(world=world, micro_batch=micro_batch, grad_accum=grad_accum, n_samples=12, seed=0,
                        streaming=streaming, sources=(("cache", 12, 1.0),))
    return {"step": 4, "epoch": 1, "position": 0, "data_layout": layout.to_dict()}


def test_the_resume_rule_what_may_change_and_what_may_not(tmp_path: Path) -> None:
    """The split over processes may change (zarr); the global batch, the data and a streaming
    cache's world may not, each refused naming checkpoint vs now and what works."""
    now = DataLayout(world=1, micro_batch=1, grad_accum=4, n_samples=12, seed=0, sources=(("cache", 12, 1.0),))
    check_resumable(tmp_path, saved_state(2, 1, 2, streaming=False), now)
    check_resumable(tmp_path, saved_state(4, 1, 1, streaming=False), now)
    with pytest.raises(ResumeError, match=r"resume on 2 processes, or train from a zarr cache"):
        check_resumable(tmp_path, saved_state(2, 1, 2, streaming=True), replace(now, streaming=True))
    with pytest.raises(ResumeError, match=r"no grad_accum keeps it with micro_batch 1 on 3 processes"):
        check_resumable(tmp_path, saved_state(2, 1, 2, streaming=False), replace(now, world=3))
    with pytest.raises(ResumeError, match=r"samples per epoch \(checkpoint 12, now 13\)"):
        check_resumable(tmp_path, saved_state(2, 1, 2, streaming=False), replace(now, n_samples=13))
    with pytest.raises(ResumeError, match=r"seed \(checkpoint 0, now 1\)"):
        check_resumable(tmp_path, saved_state(2, 1, 2, streaming=False), replace(now, seed=1))
