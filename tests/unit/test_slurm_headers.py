"""The SLURM examples' headers, read as text: 2 exclusive nodes with 8 GPUs and one task each, and
SIGUSR1 ten minutes before the time limit for a requeue. (The scripts run under a fake SLURM:
tests/e2e/test_slurm_examples.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers.commands import SLURM_DIR
from janus_train.loop.preemption import PREEMPTED_EXIT_CODE


def sbatch_options(script: Path) -> dict[str, str | None]:
    """The #SBATCH options sbatch reads: those of the comment block before the first command."""
    lines = script.read_text().splitlines()
    header = []
    for line in lines[1:]:
        if line.strip() and not line.startswith("#"):
            break
        header.append(line)
    options = {}
    for line in header:
        if line.startswith("#SBATCH"):
            name, _, value = line.removeprefix("#SBATCH").strip().partition("=")
            options[name] = value or None
    later = [line for line in lines[len(header) + 1:] if line.startswith("#SBATCH")]
    assert not later, f"{script.name}: #SBATCH lines after the first command are ignored by sbatch: {later}"
    return options


@pytest.mark.parametrize("script", ["precompute.sbatch", "train.sbatch"])
def test_the_header_asks_for_2_exclusive_nodes_with_8_gpus_and_one_task_each(script: str) -> None:
    """One task per node (torchrun starts the GPU processes), whole nodes (every core decodes or
    loads data), all of each node's memory."""
    options = sbatch_options(SLURM_DIR / script)
    assert options["--nodes"] == "2"
    assert options["--ntasks-per-node"] == "1"
    assert options["--gpus-per-node"] == "8"
    assert "--exclusive" in options and options["--exclusive"] is None
    assert options["--mem"] == "0"
    assert options["--job-name"] == f"janus-{script.removesuffix('.sbatch')}"


def test_train_asks_for_sigusr1_ten_minutes_before_the_time_limit_and_may_be_requeued() -> None:
    options = sbatch_options(SLURM_DIR / "train.sbatch")
    assert options["--signal"] == "B:USR1@600"
    assert "--requeue" in options and options["--open-mode"] == "append"
    # The code it requeues on is the one a stopped run exits with.
    assert f"PREEMPTED={PREEMPTED_EXIT_CODE}" in (SLURM_DIR / "train.sbatch").read_text()


def test_eval_asks_for_one_node_with_8_gpus() -> None:
    """JanusVLN's evaluation runs one process per GPU of one node (examples/slurm/eval.sbatch)."""
    options = sbatch_options(SLURM_DIR / "eval.sbatch")
    assert options["--nodes"] == "1" and options["--gpus-per-node"] == "8"
    assert options["--job-name"] == "janus-eval"
