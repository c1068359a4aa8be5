"""A full disk while training writes (issue 28 item 2): a checkpoint save, an export and the
launcher's own log each end in one line naming the path, the bytes free and needed and the fix.

The disks are real, size-limited tmpfs mounts in an unprivileged user+mount namespace of the
test's own (``unshare -rm``): the writes hit the kernel's own ENOSPC. The runs: real 2-process
launches through ``pipelines.launch`` (as ``make train`` starts them) of the tiny profile on a
precomputed cache of 2 episodes x 4 steps, 4 steps with a checkpoint every 2.

* A run directory with room for one checkpoint and a half: the step-4 save fails on the full
  disk; one ``error:`` line, no traceback, the partial tag removed, ``latest`` still names step 2.
  Moved to a disk with room, the same command resumes at step 2 and ends with the losses of a
  run that never failed.
* ``janus-train export`` into a disk too small for the weights: one ``error:`` line.
* A launcher whose log file is on a full disk: its closing line says that torchrun's report could
  not be written, with the bytes, instead of crashing with a traceback.
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
from conftest import REPO_ROOT, file_digests
from test_train import precompute, read_metrics, write_train_profile

from janus_cache.sample_data import write_sample_data
from janus_train.checkpoints import CHECKSUMS_FILE, LATEST_FILE
from janus_train.trainer import CHECKPOINTS

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


def train_command(out: Path, cache: Path, profile: Path, *extra: str) -> list[str]:
    """The launch ``make train`` makes: torchrun through pipelines.launch, its log in the run."""
    return [sys.executable, "-m", "pipelines.launch", "--launcher-log", str(out / "launcher.log"), "--standalone",
            "--nproc_per_node", "2", "-m", "pipelines.train", "--out", str(out), "--cache", str(cache),
            "--profile", str(profile), *extra]


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
def setup(tmp_path_factory: pytest.TempPathFactory) -> Setup:
    root = tmp_path_factory.mktemp("disk-full")
    data = write_sample_data(root / "data", episodes=2, steps=4, seed=0)
    profile = write_train_profile(root / "profile.yaml", cache={"feature_dtype": "float32"}, train=TRAIN)
    cache = precompute(data, root / "cache", profile)
    reference = root / "reference"
    result = run(train_command(reference, cache, profile))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    return Setup(cache, profile, reference, read_metrics(reference))


def test_a_checkpoint_save_on_a_full_disk_is_one_line_and_the_same_command_resumes_once_there_is_room(
        setup: Setup, tmp_path: Path) -> None:
    checkpoint = tag_bytes(setup.reference / CHECKPOINTS / f"step{SAVE_EVERY:08d}")
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
        rf"error: {re.escape(str(out / CHECKPOINTS / tag))}: no room left saving checkpoint {tag} \(No space left on "
        rf"device\): the disk has {SIZE} free and a checkpoint of this run takes {SIZE}; the partial checkpoint was "
        rf"removed, latest still names step{SAVE_EVERY:08d}: free space and run the same command again to resume "
        r"from it", errors[0]), errors[0]
    assert "Traceback" not in output and "Logging error" not in output, output[-5000:]
    assert lines(result, "launcher:") == [f"launcher: rank 0 exited with code 1; torchrun's report: "
                                          f"{out / 'launcher.log'}"], output[-3000:]
    assert (kept / CHECKPOINTS / LATEST_FILE).read_text() == f"step{SAVE_EVERY:08d}"
    assert not (kept / CHECKPOINTS / tag).exists(), "the partial checkpoint was left behind"

    # Room again (the run moved to a disk with space): the same command resumes and finishes the run.
    resumed = run(train_command(kept, setup.cache, setup.profile, "--no-export"))
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-5000:]
    assert f"resumed at step {SAVE_EVERY}" in resumed.stdout
    records = read_metrics(kept)
    assert [r["step"] for r in records] == [r["step"] for r in setup.records]
    for got, want in zip(records, setup.records):
        for name in ("loss", "grad_norm", "lr"):
            assert got[name] == pytest.approx(want[name], rel=1e-6, abs=1e-9), (got["step"], name)


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
from janus_train.disk_space import NoRoom, export_room, no_room_reason

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
