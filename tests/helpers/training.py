"""Training runs for the tests: the test profile's train settings, the trainer on 2 ranks (forked,
:func:`train_on_ranks`, or a real torchrun launch, :func:`torchrun_train`) and its metrics."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from helpers.forked_ranks import forked_launch
from helpers.profiles import REPO_ROOT, write_test_profile
from janus_train.run.layout import METRICS_FILE

N_PROC = 2


MAX_STEPS = 10


SAVE_EVERY = 3


LR = 2e-3


TIMEOUT_S = 300


# Tiny random models learn visibly only with large steps; no warm-up, so step 1 runs at LR.
TRAIN = {
    "micro_batch": 1,
    "grad_accum": 2,
    "epochs": 100,
    "max_steps": MAX_STEPS,
    "lr_base": LR,
    "lr_projector": LR,
    "warmup_ratio": 0.0,
    "save_every": SAVE_EVERY,
    "save_total_limit": 10,
    "log_every": 1,
    "num_workers": 0,
    "live_check_every": 5,
}


def write_train_profile(path: Path, cache: dict | None = None, vggt: dict | None = None,
                        train: dict | None = None) -> Path:
    """The tiny profile with the test's training settings (and further overrides)."""
    write_test_profile(path, cache=cache, vggt=vggt)
    data = yaml.safe_load(path.read_text())
    data["train"].update({**TRAIN, **(train or {})})
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def precompute(data: Path, out: Path, profile: Path) -> Path:
    from pipelines.precompute_run import Options, run

    assert run(Options(data, out, profile=str(profile), workers=1)) == 0, f"precompute of {out} failed"
    return out


def torchrun_train(*args: str | Path | int, nproc: int = N_PROC) -> subprocess.CompletedProcess[str]:
    """``torchrun --standalone --nproc_per_node N -m pipelines.train ARGS`` as a real launch."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
               "-m", "pipelines.train", *map(str, args)]
    return subprocess.run(command, cwd=REPO_ROOT, env=dict(os.environ), capture_output=True, text=True, check=False,
                          timeout=TIMEOUT_S)


def train_on_ranks(*args: str | Path | int, nproc: int = N_PROC, kill_when: Callable[[], bool] | None = None,
                   env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``pipelines.train ARGS`` on ``nproc`` ranks as torchrun starts them, each forked from a process
    that imported the command once (:mod:`helpers.forked_ranks`; ``kill_when``: SIGKILL of every
    rank once it holds; ``env``: the launch's environment instead of this process's)."""
    return forked_launch("pipelines.train", *args, nproc=nproc, env=env, timeout=TIMEOUT_S, kill_when=kill_when)


def stop_when(command: list[str], ready: Callable[[], bool], sig: int = signal.SIGTERM,
              timeout: float = TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    """Run the launcher ``command`` (e.g. ``python -m pipelines.launch ...``, what ``make train`` runs)
    from the repository; once ``ready()`` holds, send ``sig`` to the launcher alone."""
    process = subprocess.Popen(command, cwd=REPO_ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"},
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + timeout
    try:
        while not ready():
            assert process.poll() is None, f"the run ended before it was to be stopped: {process.communicate()}"
            assert time.monotonic() < deadline, "timed out waiting to stop the run"
            time.sleep(0.05)
        process.send_signal(sig)
        stdout, stderr = process.communicate(timeout=max(1.0, deadline - time.monotonic()))
    except BaseException:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        raise
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def assert_succeeded(result: subprocess.CompletedProcess[str]) -> None:
    assert result.returncode == 0, f"training failed ({result.returncode}):\n{result.stdout[-3000:]}\n{result.stderr[-5000:]}"


def read_metrics(run: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run / METRICS_FILE).read_text().splitlines()]

