"""The tests' forked ranks (helpers.forked_ranks) run a command as torchrun does.

Most e2e runs of the trainer start their 2 ranks with torch's elastic agent from a process that
imported the command once, instead of a real ``torchrun``; this holds them to the real thing: the
session's reference run (a real torchrun launch, helpers.shared_runs) repeated on forked ranks
trains the same steps with the same losses, gradients and learning rates, saves the same
checkpoints, computes the same final outputs and prints the same console lines (but for the
measured speeds), with the command line a run records being the one torchrun gives it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from safetensors.torch import load_file

from helpers.shared_runs import RECORDED_SAMPLES, ReferenceRun, TinyTraining
from helpers.training import assert_succeeded, read_metrics, train_on_ranks
from janus_train.run.layout import CHECKPOINTS_DIR, RunLayout

MEASURED = re.compile(r"\d+(\.\d+)? samples/s wait \d+% \| eta \d+:\d+:\d+|\d+(\.\d+)? s\b")
"""What differs between two runs of the same command: the speeds and times they measure."""


def console(text: str) -> list[str]:
    return [MEASURED.sub("<measured>", line) for line in text.splitlines()]


def test_forked_ranks_repeat_the_real_torchrun_reference_run(tiny_training: TinyTraining, reference_run: ReferenceRun,
                                                              tmp_path: Path) -> None:
    out, outputs = tmp_path / "run", tmp_path / "final_outputs.safetensors"
    result = train_on_ranks("--out", out, "--cache", tiny_training.fp32_cache, "--profile", tiny_training.fp32_profile,
                            "--record-outputs", outputs, "--record-samples", RECORDED_SAMPLES)
    assert_succeeded(result)

    keys = ("step", "epoch", "loss", "token_loss", "action_loss", "grad_norm", "lr")
    assert [{k: r[k] for k in keys} for r in read_metrics(out)] == [{k: r[k] for k in keys} for r in reference_run.records]
    assert sorted(p.name for p in (out / CHECKPOINTS_DIR).iterdir()) == sorted(
        p.name for p in (reference_run.out / CHECKPOINTS_DIR).iterdir())
    forked, real = load_file(str(outputs)), load_file(str(reference_run.outputs))
    assert forked.keys() == real.keys() and all(forked[k].equal(real[k]) for k in real)

    assert console(result.stdout.replace(str(out), "RUN")) == console(reference_run.stdout.replace(
        str(reference_run.out), "RUN"))
    start = json.loads(RunLayout(out).run_file.read_text())["starts"][0]
    assert start["command"][1:4] == ["-u", "-m", "pipelines.train"] and start["world"] == 2
