"""A full disk while training writes: a checkpoint save, an export and the
launcher's own log each end in one line naming the path, the bytes free and needed and the fix.

The disks are real, size-limited tmpfs mounts in an unprivileged user+mount namespace of the
test's own (``unshare -rm``): the writes hit the kernel's own ENOSPC. The runs on a small disk: real
2-process launches through ``pipelines.launch`` (as ``make train`` starts them) of the tiny profile on
the session's float32 cache of 2 episodes x 4 steps (helpers.shared_runs), 4 steps with a checkpoint
every 2; the uninterrupted run and the resumes on a disk with room: the same command on 2 ranks
started by torch's elastic agent (helpers.training.train_on_ranks).

* A run directory with room for one checkpoint and a half: the step-4 save fails on the full
  disk; one ``error:`` line, no traceback, the partial tag removed, ``latest`` still names step 2.
  Moved to a disk with room, the same command resumes at step 2 and ends with the losses of a
  run that never failed.
* ``janus-train export`` into a disk too small for the weights: one ``error:`` line.
* A launcher whose log file is on a full disk: its closing line says that torchrun's report could
  not be written, with the bytes, instead of crashing with a traceback.
* A new best checkpoint at a validation that does not fit: one line, the best there was kept
  byte for byte, and the same command resumes once there is room.
* A metrics record (``metrics.jsonl`` or TensorBoard's events) that does not fit: one line, and
  ``metrics.jsonl`` holds whole records only; a resume on a disk still full drops the later
  records in place (no room needed).
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from helpers.profiles import REPO_ROOT, file_digests, write_test_profile
from helpers.shared_runs import TinyTraining
from helpers.training import TRAIN as TRAIN_TEST_SETTINGS
from helpers.training import read_metrics, train_on_ranks, write_train_profile
from janus_train.checkpoint.best import BEST_FILE, BEST_TAG
from janus_train.checkpoint.store import CHECKSUMS_FILE, LATEST_FILE
from janus_train.run.layout import CHECKPOINTS_DIR

STEPS, SAVE_EVERY = 4, 2
TRAIN = {"max_steps": STEPS, "save_every": SAVE_EVERY, "save_total_limit": 10, "live_check_every": 0}
TIMEOUT_S = 600
PAGE = 4096
SIZE = r"[0-9.]+ [KMGT]?B"
JANUS_TRAIN = str(Path(sys.executable).parent / "janus-train")


def run(command: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)


def _namespaces_work() -> bool:
    probe = run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c",
                 "mount -t tmpfs -o size=64k tmpfs /mnt && test -d /mnt"]) if shutil.which("unshare") else None
    return probe is not None and probe.returncode == 0


pytestmark = pytest.mark.skipif(not _namespaces_work(),
                                reason="needs unprivileged user+mount namespaces (unshare -rm) for a small tmpfs")


def on_small_disk(mount: Path, size: int, script: str) -> subprocess.CompletedProcess[str]:
    """Run the shell ``script`` with a tmpfs of ``size`` bytes mounted at ``mount`` (in a namespace
    of its own: the mount ends with the script)."""
    mount.mkdir(exist_ok=True)
    return run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c",
                f"mount -t tmpfs -o size={size} tmpfs {shlex.quote(str(mount))} && {script}"])


def train_args(out: Path, cache: Path, profile: Path, *extra: str) -> list[str]:
    return ["--out", str(out), "--cache", str(cache), "--profile", str(profile), *extra]


def train_command(out: Path, cache: Path, profile: Path, *extra: str) -> list[str]:
    """The launch ``make train`` makes: torchrun through pipelines.launch, its log in the run."""
    return [sys.executable, "-m", "pipelines.launch", "--launcher-log", str(out / "launcher.log"), "--standalone",
            "--nproc_per_node", "2", "-m", "pipelines.train", *train_args(out, cache, profile, *extra)]


def tag_bytes(tag_dir: Path) -> int:
    return sum(entry["bytes"] for entry in json.loads((tag_dir / CHECKSUMS_FILE).read_text())["files"].values())


def lines(result: subprocess.CompletedProcess[str], start: str) -> list[str]:
    return [line for line in (result.stdout + result.stderr).splitlines() if line.startswith(start)]


@dataclass(frozen=True)
class Setup:
    cache: Path
    profile: Path
    reference: Path  # a run that never failed
    records: list[dict[str, Any]]


@pytest.fixture(scope="module")
def setup(tiny_training: TinyTraining, tmp_path_factory: pytest.TempPathFactory) -> Setup:
    root = tmp_path_factory.mktemp("disk-full")
    # The session's float32 cache: these settings train differently, but on the same cache.
    profile = write_train_profile(root / "profile.yaml", cache={"feature_dtype": "float32"}, train=TRAIN)
    cache = tiny_training.fp32_cache
    reference = root / "reference"
    result = train_on_ranks(*train_args(reference, cache, profile))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    return Setup(cache, profile, reference, read_metrics(reference))


def test_a_checkpoint_save_on_a_full_disk_is_one_line_and_the_same_command_resumes_once_there_is_room(
        setup: Setup, tmp_path: Path) -> None:
    checkpoint = tag_bytes(setup.reference / CHECKPOINTS_DIR / f"step{SAVE_EVERY:08d}")
    size = (checkpoint * 3 // 2 // PAGE) * PAGE  # step 2's checkpoint fits, step 4's does not
    mount, kept = tmp_path / "small-disk", tmp_path / "kept"
    out = mount / "run"
    command = shlex.join(train_command(out, setup.cache, setup.profile, "--no-export"))
    result = on_small_disk(mount, size, f"{command}; code=$?; cp -a {shlex.quote(str(out))} "
                                        f"{shlex.quote(str(kept))}; exit $code")
    output = result.stdout + result.stderr
    assert result.returncode == 1, output[-5000:]
    errors = lines(result, "error:")
    tag = f"step{2 * SAVE_EVERY:08d}"
    assert len(errors) == 1, output[-5000:]
    assert re.fullmatch(
        rf"error: {re.escape(str(out / CHECKPOINTS_DIR / tag))}: no room left saving checkpoint {tag} \(No space left on "
        rf"device\): the disk has {SIZE} free and a checkpoint of this run takes {SIZE}; the partial checkpoint was "
        rf"removed, latest still names step{SAVE_EVERY:08d}: free space and run the same command again to resume "
        r"from it", errors[0]), errors[0]
    assert "Traceback" not in output and "Logging error" not in output, output[-5000:]
    assert lines(result, "launcher:") == [f"launcher: rank 0 exited with code 1; torchrun's report: "
                                          f"{out / 'launcher.log'}"], output[-3000:]
    assert (kept / CHECKPOINTS_DIR / LATEST_FILE).read_text() == f"step{SAVE_EVERY:08d}"
    assert not (kept / CHECKPOINTS_DIR / tag).exists(), "the partial checkpoint was left behind"

    # Room again (the run moved to a disk with space): the same command resumes and finishes the run.
    resumed = train_on_ranks(*train_args(kept, setup.cache, setup.profile, "--no-export"))
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-5000:]
    assert f"resumed at step {SAVE_EVERY}" in resumed.stdout
    records = read_metrics(kept)
    assert [r["step"] for r in records] == [r["step"] for r in setup.records]
    for got, want in zip(records, setup.records):
        for name in ("loss", "grad_norm", "lr"):
            assert got[name] == pytest.approx(want[name], rel=1e-6, abs=1e-9), (got["step"], name)


def test_a_best_checkpoint_that_does_not_fit_is_one_line_and_keeps_the_best_there_was(
        setup: Setup, tmp_path: Path) -> None:
    """A run validating at its last step (one episode held out, best by val_loss) whose run
    directory already holds a best checkpoint (a worse val_loss recorded), on a disk with room for
    that best and one checkpoint and a half: step 2's checkpoint fits, step 4's new best does not.
    One line on every rank, ``best.partial`` removed, the best there was kept byte for byte and
    ``latest`` still at step 2; with room again the same command resumes at step 2 and keeps the
    new best."""
    profile = write_test_profile(tmp_path / "validating.yaml", cache={"feature_dtype": "float32"}, keep_validation=True)
    data = yaml.safe_load(profile.read_text())
    data["train"].update({**TRAIN_TEST_SETTINGS, **TRAIN, "val_episodes": 1, "eval_every": STEPS,
                          "best_metric": "val_loss"})
    profile.write_text(yaml.safe_dump(data, sort_keys=False))
    earlier = tmp_path / BEST_TAG  # the best there was: a checkpoint with a worse val_loss than any to come
    shutil.copytree(setup.reference / CHECKPOINTS_DIR / f"step{SAVE_EVERY:08d}", earlier)
    (earlier / BEST_FILE).write_text(json.dumps({"metric": "val_loss", "value": 1e9, "step": 0}) + "\n")
    checkpoint = tag_bytes(setup.reference / CHECKPOINTS_DIR / f"step{SAVE_EVERY:08d}")
    best_pages = sum(-(-p.stat().st_size // PAGE) for p in earlier.rglob("*") if p.is_file())
    size = best_pages * PAGE + (checkpoint * 3 // 2 // PAGE) * PAGE
    mount, kept = tmp_path / "small-disk", tmp_path / "kept"
    out = mount / "run"
    command = shlex.join(train_command(out, setup.cache, profile, "--no-export"))
    place = (f"mkdir -p {shlex.quote(str(out / CHECKPOINTS_DIR))} && "
             f"cp -a {shlex.quote(str(earlier))} {shlex.quote(str(out / CHECKPOINTS_DIR / BEST_TAG))}")
    result = on_small_disk(mount, size, f"{place} && {command}; code=$?; "
                                        f"cp -a {shlex.quote(str(out))} {shlex.quote(str(kept))}; exit $code")
    output = result.stdout + result.stderr
    assert result.returncode == 1, output[-5000:]
    errors = lines(result, "error:")
    assert len(errors) == 1, output[-5000:]
    partial = out / CHECKPOINTS_DIR / f"{BEST_TAG}.partial"
    assert re.fullmatch(
        rf"error: {re.escape(str(partial))}: no room left saving the best checkpoint of step {STEPS} \(val_loss "
        rf"[0-9.e+-]+\) \(No space left on device\): the disk has {SIZE} free and the best checkpoint takes {SIZE}; "
        r"the partial best checkpoint was removed, the best of step 0 \(val_loss 1e\+09\) is kept as it was; latest "
        rf"still names step{SAVE_EVERY:08d}: free space and run the same command again to resume from it",
        errors[0]), errors[0]
    assert "Traceback" not in output and "Logging error" not in output, output[-5000:]
    assert lines(result, "launcher:") == [f"launcher: rank 0 exited with code 1; torchrun's report: "
                                          f"{out / 'launcher.log'}"], output[-3000:]
    assert file_digests(kept / CHECKPOINTS_DIR / BEST_TAG) == file_digests(earlier)
    assert not (kept / CHECKPOINTS_DIR / f"{BEST_TAG}.partial").exists(), "the partial best was left behind"
    assert (kept / CHECKPOINTS_DIR / LATEST_FILE).read_text() == f"step{SAVE_EVERY:08d}"

    resumed = train_on_ranks(*train_args(kept, setup.cache, profile, "--no-export"))
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-5000:]
    assert f"resumed at step {SAVE_EVERY}" in resumed.stdout
    best = json.loads((kept / CHECKPOINTS_DIR / BEST_TAG / BEST_FILE).read_text())
    assert best["step"] == STEPS and best["value"] == read_metrics(kept)[-1]["val_loss"]


def test_a_finished_run_whose_export_does_not_fit_ends_every_rank_with_one_line(setup: Setup, tmp_path: Path) -> None:
    """The finished reference run (with its export) on a disk with room for itself only: the same
    command with ``--export`` (rank 0 exports again after the last step) is refused before the new
    export's first byte, so the earlier export is left as it was."""
    mount, kept = tmp_path / "small-disk", tmp_path / "kept-export"
    out = mount / "run"
    pages = sum(-(-p.stat().st_size // PAGE) for p in setup.reference.rglob("*") if p.is_file())
    command = shlex.join(train_command(out, setup.cache, setup.profile, "--export"))
    result = on_small_disk(mount, (pages + 64) * PAGE,
                           f"cp -a {shlex.quote(str(setup.reference))} {shlex.quote(str(out))} && {command}; "
                           f"code=$?; cp -a {shlex.quote(str(out / 'export'))} {shlex.quote(str(kept))}; exit $code")
    output = result.stdout + result.stderr
    assert result.returncode == 1, output[-5000:]
    errors = lines(result, "error:")
    assert len(errors) == 1 and "Traceback" not in output, output[-5000:]
    assert re.fullmatch(
        rf"error: {re.escape(str(out / 'export'))}: no room left writing the export \(not enough free space\): the "
        rf"disk has {SIZE} free and the export needs {SIZE}; free space, or write it elsewhere with janus-train "
        rf"export {re.escape(str(out))} --out DIR \(the checkpoints are unchanged\)", errors[0]), errors[0]
    assert file_digests(kept) == file_digests(setup.reference / "export")


def test_an_export_to_a_full_disk_is_one_line(setup: Setup, tmp_path: Path) -> None:
    mount = tmp_path / "small-disk"
    export = [JANUS_TRAIN, "export", str(setup.reference), "--out", str(mount / "export"), "--profile",
              str(setup.profile)]
    result = on_small_disk(mount, 16 * PAGE, shlex.join(export))
    output = result.stdout + result.stderr
    assert result.returncode == 1, output[-3000:]
    assert len(lines(result, "error:")) == 1 and "Traceback" not in output, output[-3000:]
    assert re.fullmatch(
        rf"error: {re.escape(str(mount / 'export'))}: no room left writing the export \(not enough free space\): the "
        rf"disk has {SIZE} free and the export needs {SIZE}; free space, or write it elsewhere with janus-train "
        rf"export {re.escape(str(setup.reference))} --out DIR \(the checkpoints are unchanged\)",
        lines(result, "error:")[0]), output[-3000:]


def test_a_launcher_whose_log_is_on_a_full_disk_says_so_in_its_one_line(setup: Setup, tmp_path: Path) -> None:
    """The rank fails at once (a usage error); torchrun's report cannot be written to the full disk."""
    mount = tmp_path / "small-disk"
    log = mount / "launcher.log"
    launch = [sys.executable, "-m", "pipelines.launch", "--launcher-log", str(log), "--standalone",
              "--nproc_per_node", "1", "-m", "pipelines.train", "--out", str(tmp_path / "run"), "--profile",
              str(setup.profile)]
    fill = f"cat /dev/zero > {shlex.quote(str(mount / 'filler'))} 2>/dev/null"
    result = on_small_disk(mount, 16 * PAGE, f"{fill}; {shlex.join(launch)}")
    output = result.stdout + result.stderr
    assert result.returncode == 2, output[-3000:]
    assert lines(result, "error:") == ["error: give exactly one of --cache or --live-data"], output[-3000:]
    assert "Traceback" not in output and "Logging error" not in output, output[-3000:]
    launcher = lines(result, "launcher:")
    assert len(launcher) == 1, output[-3000:]
    assert re.fullmatch(
        rf"launcher: rank 0 exited with code 2; torchrun's report could not be written to {re.escape(str(log))} "
        rf"\(No space left on device\): the disk has 0 B free and the report needs {SIZE}; free space there or "
        r"pass --launcher-log FILE on another disk", launcher[0]), launcher[0]


NO_ROOM_WRITES = """
import sys, torch
from pathlib import Path
from safetensors.torch import save_file
from janus_core.system.disk_space import NoRoom, export_room, no_room_reason

out = Path(sys.argv[1])
tensors = {"w": torch.zeros(1 << 20)}  # 4 MiB, on a 2 MiB disk
writes = {"torch.save": lambda: torch.save(tensors, out / "a.pt"),
          "safetensors": lambda: save_file(tensors, str(out / "b.safetensors")),
          "open": lambda: (out / "c.bin").write_bytes(bytes(4 << 20))}
for name, write in writes.items():
    try:
        write()
        print(name, "wrote")
    except Exception as err:
        print(name, no_room_reason(err, out))
    for p in out.iterdir():
        p.unlink()
try:
    with export_room(out / "export", 1, Path("RUN")):  # passes the check before the first byte
        (out / "export").mkdir()
        save_file(tensors, str(out / "export" / "model.safetensors"))
except NoRoom as err:
    print("export", err)
print("other", no_room_reason(RuntimeError("a bug"), out))
"""


def test_every_writer_running_out_of_room_is_told_apart_from_other_failures(tmp_path: Path) -> None:
    """torch's zip writer (a bare RuntimeError), safetensors (its own error type) and plain file
    writes on a real full disk all read as "no room"; an export that passes the check before its
    first byte and fills the disk anyway is the same one line; any other error is not."""
    mount = tmp_path / "small-disk"
    result = on_small_disk(mount, 512 * PAGE, shlex.join([sys.executable, "-c", NO_ROOM_WRITES, str(mount)]))
    assert result.returncode == 0, result.stderr[-3000:]
    said = dict(line.split(" ", 1) for line in result.stdout.splitlines())
    assert said["torch.save"] == said["safetensors"] == said["open"] == "No space left on device", result.stdout
    assert re.fullmatch(rf"{re.escape(str(mount / 'export'))}: no room left writing the export \(No space left on "
                        rf"device\): the disk has {SIZE} free and the export needs 1 B; free space, or write it "
                        r"elsewhere with janus-train export RUN --out DIR \(the checkpoints are unchanged\)",
                        said["export"]), said["export"]
    assert said["other"] == "None"


FULL_LOG = """
import json, sys
from pathlib import Path
from janus_train.checkpoint.store import Checkpoints, LATEST_FILE, record_directory
from janus_core.system.disk_space import NoRoom
from janus_train.loop.logs import RunLog, write_alike

disk, elsewhere, sink = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
checkpoints = Checkpoints(elsewhere / "checkpoints")  # a run whose step-2 checkpoint is complete
(checkpoints.directory / "step00000002").mkdir(parents=True)
(checkpoints.directory / "step00000002" / "weights").write_bytes(b"w")
record_directory(checkpoints.directory / "step00000002")
(checkpoints.directory / LATEST_FILE).write_text("step00000002")
# One sink on the small disk: metrics.jsonl, or TensorBoard's events (in the run folder).
metrics = (disk if sink == "metrics" else elsewhere) / "metrics.jsonl"
log = RunLog((disk if sink == "tensorboard" else elsewhere) / "run", metrics, total_steps=10**6)
record = {"step": 0, "epoch": 0, "loss": 1.0, "token_loss": 1.0, "action_loss": 0.5, "grad_norm": 1.0, "lr": 1e-4,
          "samples_per_s": 1.0, "data_wait_share": 0.1, "step_s": 1.0, "sample_keys": ["x" * 1000]}
step = 0
try:
    while True:
        step += 1
        write_alike(log, {**record, "step": step}, checkpoints)
except NoRoom as err:
    print("error:", err, file=sys.stderr)
log.close()
steps = [json.loads(line)["step"] for line in metrics.read_text().splitlines()]
print(json.dumps({"failed_at": step, "steps": steps}))
"""


@pytest.mark.parametrize("sink", ["metrics", "tensorboard"])
def test_a_metrics_record_that_does_not_fit_is_one_line_and_leaves_whole_records(tmp_path: Path, sink: str) -> None:
    """``metrics.jsonl`` or TensorBoard's event file (written on a thread of its own) filling a real
    disk: the one line names the file, the bytes free and the record's, and how the run resumes
    (the checkpoints untouched); no traceback of TensorBoard's thread; ``metrics.jsonl`` holds
    whole records only, step by step (a line cut short would be read as a record lost)."""
    mount, elsewhere = tmp_path / "small-disk", tmp_path / "elsewhere"
    elsewhere.mkdir()
    result = on_small_disk(mount, 16 * PAGE, shlex.join([sys.executable, "-c", FULL_LOG, str(mount),
                                                         str(elsewhere), sink]))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr and "Exception in thread" not in result.stderr, result.stderr[-3000:]
    errors = lines(result, "error:")
    assert len(errors) == 1, result.stderr[-3000:]
    said = json.loads(result.stdout.splitlines()[-1])
    path = mount / "run" / "tensorboard" if sink == "tensorboard" else mount / "metrics.jsonl"
    assert re.fullmatch(
        rf"error: {re.escape(str(path))}: no room left writing the metrics of step {said['failed_at']} \(No space "
        rf"left on device\): the disk has {SIZE} free and the step's record needs {SIZE}; the checkpoints are "
        r"unchanged, latest still names step00000002: free space and run the same command again to resume from it",
        errors[0]), errors[0]
    written = said["failed_at"] - (1 if sink == "metrics" else 0)  # TensorBoard fails after the record's line
    assert said["steps"] == list(range(1, written + 1))


STILL_FULL = """
import json, sys
from pathlib import Path
from janus_train.loop.logs import RunLog

metrics = Path(sys.argv[1]) / "metrics.jsonl"
RunLog(metrics.parent, metrics, total_steps=5).resume_at(3)
print(json.dumps([json.loads(line)["step"] for line in metrics.read_text().splitlines()]))
"""


def test_a_resume_on_a_disk_that_is_still_full_drops_the_later_records_in_place(tmp_path: Path) -> None:
    """The same command run again before any room was freed: dropping the records after the
    resumed checkpoint (steps 4 and 5, the last cut short by the failure) needs no room, so the
    run gets as far as its next write, whose one line says the disk is full."""
    mount = tmp_path / "small-disk"
    records = "".join(json.dumps({"step": step, "loss": 1.0}) + "\n" for step in range(1, 5)) + '{"step": 5, "lo'
    fill = f"cat /dev/zero > {shlex.quote(str(mount / 'filler'))} 2>/dev/null"
    write = f"printf %s {shlex.quote(records)} > {shlex.quote(str(mount / 'metrics.jsonl'))}"
    resume = shlex.join([sys.executable, "-c", STILL_FULL, str(mount)])
    result = on_small_disk(mount, 16 * PAGE, f"{write} && {fill}; {resume}")
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout.splitlines()[-1]) == [1, 2, 3]
