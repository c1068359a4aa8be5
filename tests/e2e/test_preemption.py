"""Preemption: a stop signal ends a run after its current optimizer step with a
checkpoint, exit code 75 and one line naming the step it resumes from; a second signal ends it at once.

Real components: a zarr cache of 3 episodes x 4 steps, ``python -m pipelines.launch`` (what
``make train`` runs) of 2 processes under DeepSpeed ZeRO-3 on gloo, signals to the launcher; the
uninterrupted run and the resume (the same command's ranks) run on forked ranks (helpers.forked_ranks).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from helpers.commands import make_env
from helpers.processes import descendants, describe
from helpers.profiles import REPO_ROOT, write_test_profile
from helpers.shared_runs import TinyTraining
from helpers.training import assert_succeeded, stop_when, train_on_ranks
from janus_train.checkpoint.store import Checkpoints, tag_name
from janus_train.loop.preemption import PREEMPTED_EXIT_CODE

STEPS = 8
TIMEOUT_S = 600
REL = 1e-6  # the same processes, samples and order: only float32 noise of a reloaded state


def write_profile(path: Path, **train: Any) -> Path:
    write_test_profile(path, cache={"feature_dtype": "float32"})
    data = yaml.safe_load(path.read_text())
    # save_every 0: no checkpoint before the end, so a resume can only start from the stop's.
    data["train"].update({"micro_batch": 1, "grad_accum": 2, "epochs": 100, "max_steps": STEPS,
                          "warmup_ratio": 0.0, "lr_base": 2e-3, "lr_projector": 2e-3, "save_every": 0,
                          "log_every": 1, "num_workers": 0, **train})
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def launch_command(out: Path, cache: Path, profile: Path) -> list[str]:
    return [sys.executable, "-m", "pipelines.launch", "--launcher-log", str(out / "launcher.log"), "--standalone",
            "--nproc_per_node=2", "-m", "pipelines.train", "--out", str(out), "--cache", str(cache),
            "--profile", str(profile), "--no-export"]


def launch(command: list[str], stop_at_step: int, sig: int = signal.SIGTERM) -> subprocess.CompletedProcess[str]:
    """Run ``command``; send ``sig`` to the launcher alone once metrics.jsonl holds ``stop_at_step``."""
    metrics = Path(command[command.index("--out") + 1]) / "metrics.jsonl"
    return stop_when(command, lambda: metrics.is_file() and any(
        json.loads(line)["step"] >= stop_at_step for line in metrics.read_text().splitlines() if line.strip()),
        sig, timeout=TIMEOUT_S)


def losses(run: Path) -> dict[int, dict[str, float]]:
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return {r["step"]: {name: r[name] for name in ("loss", "token_loss", "action_loss", "grad_norm", "lr")}
            for r in records}


@pytest.fixture(scope="module")
def setup(three_episodes: TinyTraining, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The session's float32 cache of 3 episodes x 4 steps (helpers.shared_runs) and this file's profile."""
    return three_episodes.fp32_cache, write_profile(tmp_path_factory.mktemp("preemption") / "profile.yaml")


def test_sigterm_to_the_launcher_saves_the_step_and_the_same_command_resumes_with_the_uninterrupted_losses(
        setup: tuple[Path, Path], tmp_path: Path) -> None:
    cache, profile = setup
    # The uninterrupted run: the same command's ranks, started as torchrun starts them (helpers.forked_ranks).
    assert_succeeded(train_on_ranks("--out", tmp_path / "reference", "--cache", cache, "--profile", profile,
                                    "--no-export"))

    out = tmp_path / "run"
    command = launch_command(out, cache, profile)
    stopped = launch(command, stop_at_step=2)
    assert stopped.returncode == PREEMPTED_EXIT_CODE, stopped.stdout[-2000:] + stopped.stderr[-4000:]
    lines = [line for line in stopped.stderr.splitlines() if line.startswith("stopped by")]
    assert len(lines) == 1, stopped.stderr[-4000:]
    match = re.fullmatch(r"stopped by SIGTERM after step (\d+): checkpoint (\S+) saved; run the same command again "
                         r"to resume from step \1 \(exit code 75\)", lines[0])
    assert match, lines[0]
    step = int(match.group(1))
    assert 2 <= step < STEPS, "the run stopped at the step it was in, not at its end"
    # The one line is the last thing on the console: no launcher report, no traceback.
    assert stopped.stderr.strip().splitlines()[-1] == lines[0]
    assert "Traceback" not in stopped.stderr and "launcher:" not in stopped.stderr
    # The checkpoint is a checksummed one that `latest` names, and no other was written.
    checkpoints = Checkpoints(out / "checkpoints")
    assert match.group(2) == str(out / "checkpoints" / tag_name(step))
    assert checkpoints.latest() == tag_name(step) and checkpoints.tags() == [tag_name(step)]
    assert checkpoints.damage(tag_name(step)) is None

    # The same command again (its ranks alone: the launcher has no part in a resume).
    resumed = train_on_ranks(*command[command.index("pipelines.train") + 1:])
    assert_succeeded(resumed)
    assert f"resumed at step {step} " in resumed.stdout
    want, got = losses(tmp_path / "reference"), losses(out)
    assert sorted(got) == sorted(want) == list(range(1, STEPS + 1))
    for n in range(1, STEPS + 1):
        for name, value in want[n].items():
            assert got[n][name] == pytest.approx(value, rel=REL), (n, name)


FORKING_RANK = """
import os, signal, time
from janus_train.loop.preemption import Preemption
Preemption(("SIGTERM",)).arm()
if os.fork() == 0:  # a loader worker: it inherits the handler (SIGTERM is ignored) and blocks
    worker = os.getpid()
    if os.fork() == 0:  # a process the worker forks in turn
        time.sleep(60)
        os._exit(0)
    os.kill(worker, signal.SIGTERM)
    print(worker, flush=True)
    time.sleep(60)
    os._exit(0)
time.sleep(60)
"""


def test_a_process_forked_by_an_armed_rank_dies_with_it() -> None:
    """A loader worker ignores SIGTERM (its rank's handler) and may be blocked where its own watchdog
    never looks (a read that never returns): SIGKILLing the rank ends it all the same, and a process
    it forked ends with it, rather than living on as an orphan holding the rank's pipes."""
    from helpers.processes import GRACE_S, alive, descendants

    rank = subprocess.Popen([sys.executable, "-c", FORKING_RANK], cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True)
    assert rank.stdout is not None
    try:
        worker = int(rank.stdout.readline())
        forked = descendants(rank.pid)
        assert len(forked) == 2 and worker in forked and all(map(alive, forked)), "the forked processes run"
        rank.kill()
        rank.wait()
        deadline = time.monotonic() + GRACE_S
        while (survivors := [pid for pid in forked if alive(pid)]) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert survivors == [], "processes forked by the rank outlived it"
    finally:
        for pid in descendants(rank.pid) | ({worker} if "worker" in locals() else set()):
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        rank.kill()
        rank.stdout.close()


# ------------------------------------------------------- signals sent to `make` alone reach the ranks

RANK = """
import os, sys, time
from janus_train.loop.preemption import Preemption
preemption = Preemption(("SIGTERM", "SIGINT", "SIGUSR1")).arm()
out = sys.argv[1]
open(os.path.join(out, "ready-%s" % os.environ["RANK"]), "w").close()
deadline = time.monotonic() + 60
while not preemption.requested and time.monotonic() < deadline:
    time.sleep(0.01)
with open(os.path.join(out, "received-%s" % os.environ["RANK"]), "w") as f:
    f.write(str(preemption.received))
sys.exit(75 if preemption.requested else 1)
"""


@pytest.mark.parametrize(("sent", "received"), [(signal.SIGINT, "SIGINT"), (signal.SIGTERM, "SIGTERM"),
                                                (signal.SIGHUP, "SIGTERM")])
def test_a_signal_to_make_alone_reaches_every_rank_once(tmp_path: Path, sent: int, received: str) -> None:
    """``make train`` runs pipelines.launch as make's own child (bash execs it). make passes on a
    SIGTERM and keeps a SIGINT or SIGHUP to itself (it waits for its child): each reaches both ranks
    once, as a stop request (SIGHUP as SIGTERM), not the SIGTERM alone."""
    (tmp_path / "rank.py").write_text(RANK)
    launch = (f"{sys.executable} -m pipelines.launch --launcher-log {tmp_path}/launcher.log --standalone "
              f"--nproc_per_node 2 {tmp_path}/rank.py {tmp_path}")
    (tmp_path / "Makefile").write_text(f"SHELL := /bin/bash\ntrain:\n\tOMP_NUM_THREADS=1 {launch}\n")
    env = {**make_env(), "PYTHONPATH": str(REPO_ROOT)}
    # make as a shell started in the background would have SIGINT ignored, and under nohup SIGHUP (make
    # then leaves it ignored): restore the defaults first, as a terminal's make has them.
    make = subprocess.Popen([sys.executable, "-c", "import os, signal, sys; signal.signal(signal.SIGINT, "
                             "signal.SIG_DFL); signal.signal(signal.SIGHUP, signal.SIG_DFL); "
                             "os.execvp('make', ['make', '-s', '-C', sys.argv[1], 'train'])",
                             str(tmp_path)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not all((tmp_path / f"ready-{rank}").exists() for rank in (0, 1)):
            assert make.poll() is None and time.monotonic() < deadline, make.communicate()[0]
            time.sleep(0.05)
        make.send_signal(sent)
        output, _ = make.communicate(timeout=120)
        while not all((tmp_path / f"received-{rank}").exists() for rank in (0, 1)) and time.monotonic() < deadline:
            time.sleep(0.05)  # a make killed by SIGUSR1 leaves its launcher finishing
    finally:
        if make.poll() is None:
            os.killpg(make.pid, signal.SIGKILL)
    for rank in (0, 1):
        assert (tmp_path / f"received-{rank}").read_text() == received, output


def test_a_clean_stop_under_make_is_said_to_be_one(tmp_path: Path) -> None:
    """make reports any non-zero recipe as ``Error N`` and exits 2 (GNU make has no other failure
    code), so the launcher says, in the line just before make's, that exit code 75 is a clean stop
    that the same command resumes; torchrun's "FAILED ... exitcode 75" report stays in its log,
    closed by a line saying the same. (Before: make's ``Error 75`` was the last word.)"""
    (tmp_path / "rank.py").write_text(RANK)
    log = tmp_path / "launcher.log"
    launch = (f"{sys.executable} -m pipelines.launch --launcher-log {log} --standalone "
              f"--nproc_per_node 2 {tmp_path}/rank.py {tmp_path}")
    (tmp_path / "Makefile").write_text(f"SHELL := /bin/bash\ntrain:\n\tOMP_NUM_THREADS=1 {launch}\n")
    env = {**make_env(), "PYTHONPATH": str(REPO_ROOT)}
    make = subprocess.Popen(["make", "-s", "-C", str(tmp_path), "train"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not all((tmp_path / f"ready-{rank}").exists() for rank in (0, 1)):
            assert make.poll() is None and time.monotonic() < deadline, make.communicate()[0]
            time.sleep(0.05)
        launcher = next(pid for pid in descendants(make.pid) if "pipelines.launch" in describe(pid))
        os.kill(launcher, signal.SIGUSR1)  # as examples/slurm/train.sbatch forwards SLURM's warning
        output, _ = make.communicate(timeout=120)
    finally:
        if make.poll() is None:
            os.killpg(make.pid, signal.SIGKILL)
    assert make.returncode == 2, output
    lines = output.strip().splitlines()
    assert re.fullmatch(r"make: \*\*\* \[.*train\] Error 75", lines[-1]), output
    assert lines[-2] == (f"launcher: the run stopped cleanly on SIGUSR1 with a checkpoint, to resume when the same "
                         f"command runs again; make's 'Error 75' below is this clean stop, not a failure "
                         f"(torchrun's report: {log})"), output
    report = log.read_text()
    assert "exitcode  : 75" in report and report.rstrip().endswith(
        "the ranks stopped cleanly on a stop signal after saving a checkpoint; the same command resumes the run")
