"""No orphans: every rank of every stage dies with its launcher.

torchrun starts each rank in a session of its own, so killing the launcher leaves the ranks
running unless they arranged to die with it. Each test here starts a real 2-process torchrun
launch of a stage, SIGKILLs the launcher process alone (not its process group) at a chosen moment
and checks, by pid, that no process it had started (ranks and their workers) is alive 10 s later.
A second launch into a directory still in use fails at once naming the holder; a lock left by the
killed launch is taken over by the next one (those two start their ranks as torchrun starts them,
from a process that imported the command: helpers.forked_ranks).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers.forked_ranks import forked_launch
from helpers.processes import GRACE_S, RUN_TIMEOUT, Launch, alive, descendants, describe
from helpers.profiles import REPO_ROOT, write_test_profile
from helpers.training import train_on_ranks
from janus_cache.store.layout import REPORT_NAME
from janus_core.system.lock import lock_path
from janus_train.run.layout import METRICS_FILE

# ----------------------------------------------------------------------------------- processes


def maps_torch(pid: int) -> bool:
    """``pid`` has loaded torch's native library, i.e. is importing or has imported torch."""
    try:
        return "libtorch" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


def decode_workers(launch: Launch) -> list[int]:
    """The launch's multiprocessing worker processes (spawned: their command line says so)."""
    workers = []
    for pid in descendants(launch.process.pid):
        try:
            if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes():
                workers.append(pid)
        except OSError:
            continue
    return workers


@pytest.fixture
def launches() -> list[Launch]:
    started: list[Launch] = []
    yield started
    for launch in started:
        launch.cleanup()


def lock_holder(directory: Path, mode: str) -> int | None:
    """The pid of ``directory``'s lock holder of ``mode`` as its lock file records it, or None."""
    try:
        record = json.loads(lock_path(directory).read_text())
    except (OSError, ValueError):
        return None
    return int(record["pid"]) if record["mode"] == mode else None


def error_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("error:")]


PARENT_SCRIPT = """
import os, subprocess, sys, time
env = {k: v for k, v in os.environ.items() if k != "LOCAL_RANK"}
if sys.argv[1] == "launcher":
    env["LOCAL_RANK"] = "0"
child = subprocess.Popen([sys.executable, "-c", "import pipelines, time; print('armed', flush=True); time.sleep(60)"],
                         env=env, stdout=subprocess.PIPE, text=True)
assert child.stdout.readline() == "armed\\n"
print(child.pid, flush=True)
time.sleep(60)
"""


@pytest.mark.parametrize("started_by", ["launcher", "shell"])
def test_only_a_process_started_by_a_launcher_dies_with_its_parent(started_by: str) -> None:
    """Importing the launch layer ties a process to its parent only under a launcher (LOCAL_RANK
    set): a user's own process (an interactive session, ``janus-cache``) outlives its parent."""
    parent = subprocess.Popen([sys.executable, "-c", PARENT_SCRIPT, started_by], cwd=REPO_ROOT,
                              stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    try:
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + (GRACE_S if started_by == "launcher" else 2.0)
        while alive(child) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert alive(child) == (started_by == "shell")
    finally:
        if alive(child):
            os.kill(child, signal.SIGKILL)


# ------------------------------------------------------------------------------------- setup


@pytest.fixture(scope="module")
def profile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny profile, small shards (many commits: a kill lands mid-run), long training."""
    import yaml

    path = write_test_profile(tmp_path_factory.mktemp("orphans") / "profile.yaml",
                              cache={"frames_per_shard": 4, "samples_per_shard": 2})
    data = yaml.safe_load(path.read_text())
    # Epochs as well as steps: the profile's 2 epochs of 36 samples end in 18 steps, which a slow
    # machine can finish before the test kills the launch.
    data["train"].update({"epochs": 10_000, "max_steps": 10_000, "save_every": 10_000, "num_workers": 0,
                          "log_every": 1})
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def cache(sample_dataset: Path, profile: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from pipelines.precompute_run import Options, run

    out = tmp_path_factory.mktemp("orphans-cache") / "cache"
    assert run(Options(sample_dataset, out, profile=str(profile), workers=1)) == 0
    return out


# ------------------------------------------------------------------------------------- tests


def test_ranks_killed_while_importing_die_with_the_launcher(
    sample_dataset: Path, profile: Path, tmp_path: Path, launches: list[Launch],
) -> None:
    """The launcher dies while its ranks import torch (seconds of imports before any janus code
    runs): the signal armed on the first line of the launch layer takes them down."""
    launch = Launch("pipelines.precompute", sample_dataset, "--out", tmp_path / "cache", "--profile", profile,
                    "--workers", "1", log=tmp_path / "launch.log")
    launches.append(launch)
    launch.wait_until(lambda: len(launch.ranks()) == 2 and all(maps_torch(pid) for pid in launch.ranks()),
                      "both ranks import torch")
    assert launch.kill_launcher() == [], "ranks outlived the launcher killed during their imports"
    assert not (tmp_path / "cache" / REPORT_NAME).exists(), "the ranks went on to write the cache"


STARTUP_HOLD = """
# Test hook (sitecustomize: the interpreter runs it before the rank's module and any janus import):
# a rank, once started, waits here until the test lets it go.
import os, pathlib, time
if "LOCAL_RANK" in os.environ:
    hold = pathlib.Path(os.environ["JANUS_TEST_HOLD"])
    (hold / f"{os.getpid()}.held").touch()
    while not (hold / "go").exists():
        time.sleep(0.01)
"""


def test_ranks_whose_launcher_died_before_they_armed_the_signal_end_at_once(
    sample_dataset: Path, profile: Path, tmp_path: Path, launches: list[Launch],
) -> None:
    """The launcher (``pipelines.launch``, as every make target starts torchrun)
    is killed in its ranks' first milliseconds, before they could arm the parent-death signal: a
    start-up hook holds both ranks until the launcher is dead. Let go, each rank arms the signal,
    sees that its parent is no longer the launcher that started it and ends at once, writing
    nothing (taking whoever is its parent now, it would run on as an orphan)."""
    hook, hold = tmp_path / "hook", tmp_path / "hold"
    hook.mkdir()
    hold.mkdir()
    (hook / "sitecustomize.py").write_text(STARTUP_HOLD)
    python_path = os.pathsep.join(filter(None, [str(hook), os.environ.get("PYTHONPATH")]))
    launch = Launch("pipelines.precompute", sample_dataset, "--out", tmp_path / "cache", "--profile", profile,
                    "--workers", "1", log=tmp_path / "launch.log", launcher="pipelines.launch",
                    env={"PYTHONPATH": python_path, "JANUS_TEST_HOLD": str(hold)})
    launches.append(launch)
    launch.wait_until(lambda: len(list(hold.glob("*.held"))) == 2, "both ranks are held at start-up")
    assert sorted(int(p.stem) for p in hold.glob("*.held")) == sorted(launch.ranks())

    os.kill(launch.process.pid, signal.SIGKILL)
    launch.process.wait()
    (hold / "go").touch()
    deadline = time.monotonic() + GRACE_S
    while (survivors := [pid for pid in sorted(launch.started) if alive(pid)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [describe(pid) for pid in survivors] == [], "ranks outlived a launcher killed before they armed the signal"
    assert not (tmp_path / "cache").exists(), "the orphaned ranks went on to write the cache"


def test_a_killed_precompute_leaves_no_process_and_its_lock_is_taken_over(
    sample_dataset: Path, profile: Path, tmp_path: Path, launches: list[Launch],
) -> None:
    """Killed while writing frame shards (2 decode workers per rank): ranks and workers die; the
    next launch takes the dead run's lock over, says so, and finishes the cache."""
    out = tmp_path / "cache"
    args = (sample_dataset, "--out", out, "--profile", profile, "--workers", "2")
    launch = Launch("pipelines.precompute", *args, log=tmp_path / "killed.log")
    launches.append(launch)
    launch.wait_until(lambda: "[frames]" in launch.log.read_text() and len(decode_workers(launch)) == 4,
                      "both ranks write frame shards with their decode workers")
    holder = lock_holder(out, "writer")
    assert holder in launch.ranks(), f"the lock is not held by rank 0 of the run: {holder}"
    assert launch.kill_launcher() == [], "precompute ranks or their workers outlived the launcher"
    assert not (out / REPORT_NAME).exists(), "the killed run went on to finish the cache"
    assert lock_holder(out, "writer") == holder, "the killed run's lock record is gone"

    resumed = forked_launch("pipelines.precompute", *args, timeout=RUN_TIMEOUT)  # the same command's ranks
    log = resumed.stdout + resumed.stderr
    assert resumed.returncode == 0, log[-3000:]
    assert f"note: took over the lock of {out} left by writer pid {holder} " in log, log
    assert "precompute done" in log
    assert not lock_path(out).exists()


def test_a_second_training_is_refused_and_a_killed_one_leaves_no_process(
    cache: Path, profile: Path, tmp_path: Path, launches: list[Launch],
) -> None:
    """While a 2-process training runs, a second launch into its run directory exits 1 at once
    with one line naming the holder; killing the first one's launcher mid-training ends its ranks."""
    run = tmp_path / "run"
    args = ("--out", run, "--cache", cache, "--profile", profile, "--no-export")
    launch = Launch("pipelines.train", *args, log=tmp_path / "first.log")
    launches.append(launch)
    launch.wait_until(lambda: lock_holder(run, "writer") is not None, "the run directory is locked")
    holder = lock_holder(run, "writer")

    second = train_on_ranks(*args)  # the same command's ranks, started as torchrun starts them
    assert second.returncode == 1, second.stdout + second.stderr
    errors = error_lines(second.stderr)
    assert len(errors) == 1 and f"{run} is in use by writer pid {holder} on host " in errors[0], second.stderr
    assert launch.process.poll() is None, "the second launch ended the first"

    metrics = run / METRICS_FILE
    launch.wait_until(lambda: metrics.is_file() and metrics.read_text().count("\n") >= 2, "training logs steps")
    steps = metrics.read_text().count("\n")
    assert launch.kill_launcher() == [], "training ranks outlived the launcher"
    assert metrics.read_text().count("\n") <= steps + 1, "the killed training went on logging steps"


def test_a_killed_verify_leaves_no_process(
    cache: Path, sample_dataset: Path, profile: Path, tmp_path: Path, launches: list[Launch],
) -> None:
    """verify holds a reader's lock while it checks; killing its launcher then ends its ranks."""
    launch = Launch("pipelines.verify", cache, "--data", sample_dataset, "--profile", profile, "--live", "4",
                    log=tmp_path / "verify.log")
    launches.append(launch)
    # The record, not the file: a training killed earlier on this cache left its reader's lock file.
    launch.wait_until(lambda: lock_holder(cache, "reader") in launch.ranks(), "verify holds the cache's reader lock")
    assert launch.kill_launcher() == [], "verify ranks outlived the launcher"
    assert "verify passed" not in launch.log.read_text(), "the killed verify went on to the end"
