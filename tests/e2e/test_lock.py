"""One writer per cache and per run directory.

The lock is held by real processes here: a holder is a separate Python process (the kernel's
``flock`` only excludes other open files, so a lock held in the test's own process would prove
little), and the stage tests launch real 2-process torchrun runs: two precomputes into one cache
at once, an ``--overwrite`` into a cache being written, a second training into a run directory in
use.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from helpers.profiles import REPO_ROOT, file_digests, write_test_profile
from helpers.sources import janus_cache_in_process
from janus_core.system.lock import LOCK_NAME, DirectoryBusy, DirectoryLock, lock_path

RUN_TIMEOUT = 300


HOLDER_SCRIPT = """
import sys, time
from janus_core.system.lock import DirectoryLock
lock = DirectoryLock.acquire(sys.argv[1], exclusive=sys.argv[2] == "writer")
print("held", flush=True)
time.sleep(600)
"""


def start_holder(directory: Path, mode: str = "writer") -> subprocess.Popen[str]:
    """A separate process that takes ``directory``'s lock and holds it until killed."""
    process = subprocess.Popen([sys.executable, "-c", HOLDER_SCRIPT, str(directory), mode], cwd=REPO_ROOT,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert process.stdout is not None
    line = process.stdout.readline()
    assert line == "held\n", f"the holder did not take the lock: {line}{process.stdout.read()}"
    return process


def kill(process: subprocess.Popen[str]) -> None:
    process.kill()
    process.wait()


def holder_pattern(pid: int) -> re.Pattern[str]:
    """What a refusal says about a holder: mode, pid, host and start (UTC, to the second)."""
    host = re.escape(socket.gethostname())
    return re.compile(rf"(writer|reader) pid {pid} on host {host}, started \d{{4}}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00")


def error_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("error:")]


# -------------------------------------------------------------------------------- the lock


def test_a_second_writer_is_refused_at_once_naming_the_holder(tmp_path: Path) -> None:
    directory = tmp_path / "cache"
    holder = start_holder(directory)
    try:
        started = time.monotonic()
        with pytest.raises(DirectoryBusy) as refused:
            DirectoryLock.acquire(directory)
        assert time.monotonic() - started < 0.5, "the refusal waited for the holder"
        message = str(refused.value)
        assert "\n" not in message
        assert str(directory) in message
        assert holder_pattern(holder.pid).search(message), message
        with pytest.raises(DirectoryBusy):
            DirectoryLock.acquire(directory, exclusive=False)  # nor may a reader read a cache being written
    finally:
        kill(holder)


def test_readers_share_the_lock_and_exclude_writers(tmp_path: Path) -> None:
    directory = tmp_path / "cache"
    directory.mkdir()
    reader = start_holder(directory, "reader")
    try:
        with pytest.raises(DirectoryBusy, match=holder_pattern(reader.pid)):
            DirectoryLock.acquire(directory)
        with DirectoryLock.acquire(directory, exclusive=False) as second_reader:
            assert second_reader.held
        assert lock_path(directory).exists(), "a reader deleted the lock file while another reader held it"
        with pytest.raises(DirectoryBusy, match="in use by readers"):
            DirectoryLock.acquire(directory)
    finally:
        kill(reader)
    with DirectoryLock.acquire(directory) as writer:  # the reader's end released its lock
        assert writer.held


def test_a_lock_left_by_a_killed_holder_is_taken_over_and_named(tmp_path: Path) -> None:
    directory = tmp_path / "run"
    holder = start_holder(directory)
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    assert lock_path(directory).exists(), "a SIGKILLed holder cannot delete its lock file"
    with DirectoryLock.acquire(directory) as lock:
        note = lock.takeover_note()
        assert note is not None and holder_pattern(holder.pid).search(note), note
        record = json.loads(lock_path(directory).read_text())
        assert (record["pid"], record["mode"]) == (os.getpid(), "writer")


# -------------------------------------------------------------------------- the stages


@pytest.fixture(scope="module")
def profile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_test_profile(tmp_path_factory.mktemp("lock") / "profile.yaml")


def precompute_command(data: Path, out: Path, profile: Path, *args: str, nproc: int | None = 2) -> list[str]:
    if nproc is None:
        launcher = [str(Path(sys.executable).parent / "janus-cache"), "precompute"]
    else:
        launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc),
                    "-m", "pipelines.precompute"]
    return [*launcher, str(data), "--out", str(out), "--profile", str(profile), "--workers", "1", *args]


def run_env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1"}


def wait_for_holder(directory: Path, *processes: subprocess.Popen[str], mode: str = "writer") -> int:
    """The pid recorded in ``directory``'s lock file once a process of one of the runs holds it."""
    deadline = time.monotonic() + RUN_TIMEOUT
    while True:
        try:
            record = json.loads(lock_path(directory).read_text())
            if record["mode"] == mode:
                return int(record["pid"])
        except (OSError, ValueError):
            pass
        assert any(p.poll() is None for p in processes), "the runs ended before one held the lock"
        assert time.monotonic() < deadline, "the run never took the lock"
        time.sleep(0.01)


def test_concurrent_precomputes_into_one_cache_run_exactly_one(
    sample_dataset: Path, profile: Path, tmp_path: Path,
) -> None:
    """Two 2-process launches into one OUT at once: one writes the cache, the other exits 1 with
    one line naming the holder, and the cache verifies. An ``--overwrite`` into a cache whose lock
    another process holds deletes nothing: it takes the lock first and is refused alike."""
    out = tmp_path / "cache"
    command = precompute_command(sample_dataset, out, profile)
    runs = [subprocess.Popen(command, cwd=REPO_ROOT, env=run_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True) for _ in range(2)]
    try:
        holder = wait_for_holder(out, *runs)
        results = [run.communicate(timeout=RUN_TIMEOUT) for run in runs]
    finally:
        for run in runs:
            if run.poll() is None:
                run.kill()
                run.wait()
    codes = sorted(run.returncode for run in runs)
    assert codes == [0, 1], f"exit codes {codes}:\n" + "\n".join(out + err for out, err in results)
    loser_out, loser_err = results[[run.returncode for run in runs].index(1)]
    errors = error_lines(loser_err)
    assert len(errors) == 1, loser_err
    assert str(out) in errors[0] and holder_pattern(holder).search(errors[0]), errors[0]
    assert "precompute done" not in loser_out

    assert not lock_path(out).exists(), "the finished run left its lock file"
    # janus-cache's commands from here on run in this process: the lock holders are other processes.
    verify = janus_cache_in_process("verify", out, "--profile", profile, "--data", sample_dataset, "--live", "0")
    assert verify.returncode == 0, verify.stdout + verify.stderr

    before = file_digests(out)
    writer = start_holder(out)
    try:
        overwrite = janus_cache_in_process(*precompute_command(sample_dataset, out, profile, "--overwrite",
                                                               nproc=None)[1:])
    finally:
        kill(writer)
    assert overwrite.returncode == 1, overwrite.stdout + overwrite.stderr
    assert error_lines(overwrite.stderr) == [overwrite.stderr.strip()], overwrite.stderr
    assert holder_pattern(writer.pid).search(overwrite.stderr), overwrite.stderr
    assert {k: v for k, v in file_digests(out).items() if k != LOCK_NAME} == before, "--overwrite deleted files"


def test_a_precompute_into_a_cache_a_training_run_reads_is_refused_naming_the_run(tmp_path: Path) -> None:
    """Training holds a reader's lock on the cache it reads for the whole run, so an
    ``--overwrite`` (which would delete the cache under it) or an append into that cache is refused
    in one line naming the training run, and the cache is left as it was (before: both ran)."""
    from janus_core.sample_data import write_sample_data
    from pipelines.precompute_run import Options, run

    data = write_sample_data(tmp_path / "data", episodes=2, steps=4, seed=0)
    profile = write_test_profile(tmp_path / "profile.yaml")
    settings = yaml.safe_load(profile.read_text())
    settings["train"].update(epochs=100000, max_steps=0)  # trains until stopped
    profile.write_text(yaml.safe_dump(settings, sort_keys=False))
    cache, out = tmp_path / "cache", tmp_path / "run"
    assert run(Options(data, cache, str(profile), workers=1)) == 0
    before = file_digests(cache)
    more = write_sample_data(tmp_path / "more", episodes=3, steps=4, seed=0)  # an append: one more episode

    with open(tmp_path / "train.log", "w") as log:
        training = subprocess.Popen(
            [sys.executable, "-m", "pipelines.launch", "--standalone", "--nproc_per_node", "1", "-m", "pipelines.train",
             "--out", str(out), "--cache", str(cache), "--profile", str(profile), "--no-export"], cwd=REPO_ROOT, env=run_env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            reader = wait_for_holder(cache, training, mode="reader")
            refusals = [janus_cache_in_process(*precompute_command(source, cache, profile, *args, nproc=None)[1:])
                        for source, args in ((data, ("--overwrite",)), (more, ()))]  # in this process
            assert training.poll() is None, "the training run ended before the precomputes:\n" + (
                tmp_path / "train.log").read_text()[-3000:]
        finally:
            if training.poll() is None:
                training.send_signal(signal.SIGTERM)  # the launcher stops its ranks
                try:
                    training.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    os.killpg(training.pid, signal.SIGKILL)
                    training.wait()
    for refused in refusals:
        assert refused.returncode == 1, refused.stdout + refused.stderr
        assert error_lines(refused.stderr) == [refused.stderr.strip()], refused.stderr
        assert str(cache) in refused.stderr and f"for training run {out}, started" in refused.stderr, refused.stderr
        assert holder_pattern(reader).search(refused.stderr.replace(f" for training run {out}", "")), refused.stderr
    assert {k: v for k, v in file_digests(cache).items() if k != LOCK_NAME} == before, "the precompute wrote"


@pytest.mark.parametrize("target", ["notes.txt", "missing/notes.txt"], ids=["to-a-user-file", "dangling"])
def test_a_lock_file_that_is_a_symbolic_link_is_refused_and_never_written_through(
    sample_dataset: Path, profile: Path, tmp_path: Path, target: str,
) -> None:
    """``OUT/.janus.lock`` as a link to a user's file: precompute (a writer) and verify (a reader) each
    refuse in one line naming the link and the fix, and the user's file keeps its bytes (before: it was
    overwritten with the lock record); a dangling link is named as one (before: "its lock file keeps
    being deleted")."""
    notes = tmp_path / "notes.txt"
    notes.write_text("a user's notes\n")
    out = tmp_path / "cache"
    out.mkdir()
    lock_path(out).symlink_to(tmp_path / target)
    for command in (precompute_command(sample_dataset, out, profile, nproc=None)[1:], ("verify", out)):
        refused = janus_cache_in_process(*command)
        assert refused.returncode == 1, refused.stdout + refused.stderr
        assert error_lines(refused.stderr) == [refused.stderr.strip()], refused.stderr
        assert f"{lock_path(out)} is a symbolic link (to {tmp_path / target}" in refused.stderr
        assert f"rm {lock_path(out)}" in refused.stderr
        assert ("which does not exist" in refused.stderr) == (target != "notes.txt"), refused.stderr
    assert notes.read_text() == "a user's notes\n"
    assert not (tmp_path / "missing").exists()


def test_a_lock_file_deleted_under_a_running_precompute_is_put_back_or_the_run_stops(
    sample_dataset: Path, small_shards_profile: Path, tmp_path: Path,
) -> None:
    """A user deletes ``OUT/.janus.lock`` while ``janus-cache precompute`` writes OUT: the writer puts
    its lock file back within a second, so a second writer is refused naming it (before: it got in).
    When another process takes the lock in that second, the first stops with one line saying so, and
    what it committed stays (a later run resumes it)."""
    out = tmp_path / "cache"
    log = tmp_path / "precompute.log"
    with open(log, "w") as output:
        first = subprocess.Popen(precompute_command(sample_dataset, out, small_shards_profile, nproc=None),
                                 cwd=REPO_ROOT, env=run_env(), stdout=output, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + RUN_TIMEOUT
        while "[frames]" not in log.read_text():  # the lock is held and the shards are being written
            assert first.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        lock_path(out).unlink()
        while not lock_path(out).exists():
            assert first.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        with pytest.raises(DirectoryBusy, match=holder_pattern(first.pid)):
            DirectoryLock.acquire(out)

        lock_path(out).unlink()
        second = DirectoryLock.acquire(out)  # at once, before the holder looks again
        try:
            first.wait(timeout=RUN_TIMEOUT)
        finally:
            second.release()
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    printed = log.read_text()
    assert first.returncode == 1, printed
    errors = error_lines(printed)
    assert len(errors) == 1 and errors == [printed.strip().splitlines()[-1]], printed
    assert f"the lock file {lock_path(out)} was deleted while this writer held {out}" in errors[0]
    assert holder_pattern(os.getpid()).search(errors[0]), errors[0]
    assert "precompute done" not in printed
