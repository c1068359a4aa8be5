"""Checkpoints you can trust: ``latest`` names only complete, checksummed
checkpoints; a resume verifies them and falls back past a damaged one in one line; rotation never
deletes the checkpoint ``latest`` names; ``metrics.jsonl`` holds each step once after kills.

The runs: 2-process launches by torch's elastic agent (helpers.training.train_on_ranks; a kill is a
SIGKILL of every rank), DeepSpeed ZeRO-3 over gloo, of the tiny profile on the
session's float32 cache of 2 episodes x 4 steps (8 samples, 2 optimizer steps per epoch). The
reference is the session's reference run (helpers.shared_runs): 10 steps with a checkpoint every 3
(tags 3, 6, 9 and the final 10). Damage is done to copies of its checkpoints.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from helpers.shared_runs import ReferenceRun, TinyTraining
from helpers.training import LR, MAX_STEPS, SAVE_EVERY, assert_succeeded, read_metrics, train_on_ranks
from janus_core.system.files import sha256_file
from janus_train.checkpoint.store import CHECKSUMS_FILE, LATEST_FILE, Checkpoints, NoIntactCheckpoint
from janus_train.loop.parts import LRSchedule
from janus_train.run.layout import CHECKPOINTS_DIR, METRICS_FILE

STEPS = MAX_STEPS
TAGS = [f"step{s:08d}" for s in (*range(SAVE_EVERY, STEPS, SAVE_EVERY), STEPS)]  # 3, 6, 9 and the final 10


class Setup:
    def __init__(self, training: TinyTraining, reference: ReferenceRun) -> None:
        self.profile = training.fp32_profile
        self.cache = training.fp32_cache
        self.reference = reference.out
        self.records = reference.records

    def train(self, out: Path, *extra: str | int,
              kill_when: Callable[[], bool] | None = None) -> subprocess.CompletedProcess[str]:
        return train_on_ranks("--out", out, "--cache", self.cache, "--profile", self.profile, "--no-export", *extra,
                              kill_when=kill_when)

    def copy_run(self, out: Path, up_to_step: int) -> Path:
        """The reference run directory as a run that ended after step ``up_to_step`` leaves it: the
        checkpoints saved up to that step, ``latest`` naming the newest."""
        tags = [tag for tag in TAGS if int(tag.removeprefix("step")) <= up_to_step]
        for tag in tags:
            shutil.copytree(self.reference / CHECKPOINTS_DIR / tag, out / CHECKPOINTS_DIR / tag)
        (out / CHECKPOINTS_DIR / LATEST_FILE).write_text(tags[-1])
        (out / METRICS_FILE).write_text("".join(json.dumps(r) + "\n" for r in self.records[:up_to_step]))
        return out


@pytest.fixture
def setup(tiny_training: TinyTraining, reference_run: ReferenceRun) -> Setup:
    return Setup(tiny_training, reference_run)


def largest_file(tag_dir: Path) -> Path:
    """The tag's largest file (an optimizer state: damage there changes the resumed run)."""
    return max((p for p in tag_dir.rglob("*") if p.is_file() and p.name != CHECKSUMS_FILE),
               key=lambda p: p.stat().st_size)


def flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def truncate(path: Path) -> None:
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size - 100)


def assert_steps_match_the_reference(setup: Setup, records: list[dict[str, Any]], steps: range) -> None:
    by_step = {r["step"]: r for r in setup.records}
    for got in records:
        if got["step"] in steps:
            want = by_step[got["step"]]
            for name in ("loss", "grad_norm", "lr"):
                assert got[name] == pytest.approx(want[name], rel=1e-6, abs=1e-9), (got["step"], name)


# ------------------------------------------------------------------------------- saving


def test_latest_names_the_last_checkpoint_and_every_file_of_each_tag_is_recorded(setup: Setup) -> None:
    checkpoints = setup.reference / CHECKPOINTS_DIR
    assert (checkpoints / LATEST_FILE).read_text() == TAGS[-1]
    assert sorted(p.name for p in checkpoints.glob("step*")) == TAGS
    for tag in TAGS:
        files = json.loads((checkpoints / tag / CHECKSUMS_FILE).read_text())["files"]
        on_disk = sorted(p.relative_to(checkpoints / tag).as_posix() for p in (checkpoints / tag).rglob("*")
                         if p.is_file() and p.name != CHECKSUMS_FILE)
        assert sorted(files) == on_disk and len(on_disk) >= 3  # the model states + one optimizer state per rank
        for name, entry in files.items():
            path = checkpoints / tag / name
            assert entry == {"sha256": sha256_file(path), "bytes": path.stat().st_size}
    assert not list(checkpoints.glob(".*tmp"))


def test_rotation_keeps_the_newest_and_never_the_tag_latest_does_not_name(setup: Setup, tmp_path: Path) -> None:
    """Keep 2: the tag ``latest`` names and the one before it stay; older ones go, and so does a
    leftover newer than ``latest`` (a run abandoned at a resume)."""
    checkpoints = setup.copy_run(tmp_path / "run", STEPS) / CHECKPOINTS_DIR
    (checkpoints / LATEST_FILE).write_text(TAGS[2])
    assert Checkpoints(checkpoints).rotate(keep=2) == [TAGS[3], TAGS[0]]
    assert sorted(p.name for p in checkpoints.glob("step*")) == TAGS[1:3]
    assert Checkpoints(checkpoints).rotate(keep=1) == [TAGS[1]]
    assert sorted(p.name for p in checkpoints.glob("step*")) == [TAGS[2]]
    (checkpoints / LATEST_FILE).write_text("")
    assert Checkpoints(checkpoints).rotate(keep=1) == [], "with no intact tag known, nothing may go"


# ----------------------------------------------------------------- choosing where to resume


@pytest.mark.parametrize("damage, reason", [
    (lambda tag: (tag / CHECKSUMS_FILE).unlink(), f"no {CHECKSUMS_FILE}: its save did not complete"),
    (lambda tag: (tag / CHECKSUMS_FILE).write_text("{"), f"file {CHECKSUMS_FILE}: unreadable"),
    (lambda tag: largest_file(tag).unlink(), "missing"),
    (lambda tag: truncate(largest_file(tag)), "truncated ("),
    (lambda tag: flip_byte(largest_file(tag)), "checksum"),
])
def test_a_damaged_latest_falls_back_to_the_newest_intact_tag_and_repoints_latest(
    setup: Setup, tmp_path: Path, damage: Any, reason: str,
) -> None:
    checkpoints = setup.copy_run(tmp_path / "run", STEPS) / CHECKPOINTS_DIR
    damage(checkpoints / TAGS[-1])
    chosen = Checkpoints(checkpoints).resumable()
    assert chosen is not None and chosen.tag == TAGS[-2] and chosen.step == 9
    assert chosen.note is not None and chosen.note.startswith(f"checkpoint {TAGS[-1]} is damaged (")
    assert reason in chosen.note and chosen.note.endswith(f"); resuming from {TAGS[-2]}")
    assert (checkpoints / LATEST_FILE).read_text() == TAGS[-2]


@pytest.mark.parametrize("latest", ["", "  \n", None, "step00000099"])
def test_an_empty_missing_or_dangling_latest_falls_back_to_the_newest_intact_tag(
    setup: Setup, tmp_path: Path, latest: str | None,
) -> None:
    checkpoints = setup.copy_run(tmp_path / "run", STEPS) / CHECKPOINTS_DIR
    if latest is None:
        (checkpoints / LATEST_FILE).unlink()
    else:
        (checkpoints / LATEST_FILE).write_text(latest)
    chosen = Checkpoints(checkpoints).resumable()
    assert chosen is not None and chosen.tag == TAGS[-1]
    expected = {None: "is missing", "step00000099": "names 'step00000099', which does not exist"}.get(latest, "is empty")
    assert chosen.note == f"{checkpoints / LATEST_FILE} {expected}; resuming from {TAGS[-1]}"


def test_an_intact_latest_is_resumed_without_a_note_and_no_checkpoint_means_a_fresh_start(
    setup: Setup, tmp_path: Path,
) -> None:
    checkpoints = setup.copy_run(tmp_path / "run", STEPS) / CHECKPOINTS_DIR
    chosen = Checkpoints(checkpoints).resumable()
    assert chosen is not None and (chosen.tag, chosen.note) == (TAGS[-1], None)
    assert Checkpoints(tmp_path / "none").resumable() is None


def test_no_intact_checkpoint_is_an_error_naming_each_problem(setup: Setup, tmp_path: Path) -> None:
    checkpoints = setup.copy_run(tmp_path / "run", STEPS) / CHECKPOINTS_DIR
    for tag in TAGS:
        flip_byte(largest_file(checkpoints / tag))
    with pytest.raises(NoIntactCheckpoint) as err:
        Checkpoints(checkpoints).resumable()
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"no intact checkpoint in {checkpoints}: ")
    assert all(f"checkpoint {tag} is damaged (file " in message for tag in TAGS)


# --------------------------------------------------------------------- resuming for real


@pytest.mark.parametrize("damage", ["flipped byte", "truncated file", "empty latest"])
def test_training_resumes_past_a_damaged_latest_in_one_line_and_continues(
    setup: Setup, tmp_path: Path, damage: str,
) -> None:
    """The run directory of a run killed after step 9 with its last checkpoint damaged: a new launch
    prints one line naming the damage, resumes from step 6 and repeats the reference's steps 7 to 10
    (so it really loaded step 6's weights, optimizer and data position); each step logged once."""
    out = setup.copy_run(tmp_path / "run", 9)
    checkpoints = out / CHECKPOINTS_DIR
    if damage == "empty latest":
        (checkpoints / LATEST_FILE).write_text("")
        # The newest tag was never completed: its checksums were never recorded.
        (checkpoints / TAGS[2] / CHECKSUMS_FILE).unlink()
        expected = (f"{checkpoints / LATEST_FILE} is empty; checkpoint {TAGS[2]} is damaged (no {CHECKSUMS_FILE}: "
                    f"its save did not complete); resuming from {TAGS[1]}")
    else:
        victim = largest_file(checkpoints / TAGS[2])
        (flip_byte if damage == "flipped byte" else truncate)(victim)
        problem = ": checksum)" if damage == "flipped byte" else ": truncated ("
        expected = f"checkpoint {TAGS[2]} is damaged (file {victim.relative_to(checkpoints / TAGS[2]).as_posix()}: "
    result = setup.train(out)
    assert_succeeded(result)
    notes = [line for line in result.stderr.splitlines() if "resuming from" in line]
    assert len(notes) == 1 and expected in notes[0], result.stderr
    if damage != "empty latest":
        assert problem in notes[0] and notes[0].endswith(f"resuming from {TAGS[1]}")
    assert "Traceback" not in result.stderr
    assert "resumed at step 6 " in result.stdout
    records = read_metrics(out)
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    assert_steps_match_the_reference(setup, records, range(7, STEPS + 1))
    assert (checkpoints / LATEST_FILE).read_text() == TAGS[3]
    assert Checkpoints(checkpoints).damage(TAGS[2]) is None, "step 9 was saved afresh"


def test_a_run_with_no_intact_checkpoint_ends_in_one_error_line(setup: Setup, tmp_path: Path) -> None:
    out = setup.copy_run(tmp_path / "run", STEPS)
    for tag in TAGS:
        truncate(largest_file(out / CHECKPOINTS_DIR / tag))
    result = setup.train(out)
    assert result.returncode != 0
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(f"error: no intact checkpoint in {out / CHECKPOINTS_DIR}: ")
    assert "Traceback (most recent call last)" not in result.stderr.split(errors[0])[0]


# ------------------------------------------------------------------- kills and metrics


def train_until_killed(out: Path, setup: Setup, step: int) -> str:
    """The run until ``metrics.jsonl`` holds ``step``, then SIGKILL of every rank at once, as a failed
    machine or a killed launcher ends them (tests/e2e/test_orphans.py: a killed launcher's ranks die
    with it); returns the run's console."""
    metrics = out / METRICS_FILE
    killed = setup.train(out, kill_when=lambda: metrics.is_file() and f'"step": {step},' in metrics.read_text())
    assert killed.returncode != 0, killed.stdout[-2000:]
    return killed.stdout


def test_metrics_hold_each_step_once_after_two_kills(setup: Setup, tmp_path: Path) -> None:
    """Killed after step 4 (checkpoint at 3) and again after step 7 (checkpoint at 6): steps 4 and 7
    were logged twice by the killed runs; the finished run's metrics hold steps 1..10 once each,
    with the uninterrupted run's values."""
    out = tmp_path / "run"
    train_until_killed(out, setup, step=4)
    assert "resumed at step " in train_until_killed(out, setup, step=7)
    assert_succeeded(setup.train(out))
    records = read_metrics(out)
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    assert_steps_match_the_reference(setup, records, range(1, STEPS + 1))


def test_a_resume_with_another_max_steps_follows_the_new_lr_plan_and_says_so(setup: Setup, tmp_path: Path) -> None:
    """A run planned for 10 steps, resumed at step 6 with ``--max-steps 8``: the LR schedule is the
    8-step plan's from the first resumed step on (before: step 7 ran at the old plan's LR and step 8
    jumped to the new one's), and one ``note:`` line gives both plans and step 7's LR under each, and
    how to keep the checkpoint's plan. The same command without the change prints no such line."""
    out = setup.copy_run(tmp_path / "run", 6)
    resumed = setup.train(out, "--max-steps", 8)
    assert_succeeded(resumed)
    old, new = LRSchedule(STEPS, 1), LRSchedule(8, 1)  # warmup_ratio 0: one warm-up step
    notes = [line for line in resumed.stdout.splitlines() if line.startswith("note:")]
    assert notes == [f"note: the LR schedule follows this start's plan of 8 steps (warm-up 1), not the {STEPS} steps "
                     f"(warm-up 1) of checkpoint {TAGS[1]}: lr {LR * new.factor(6):.2e} at step 7 instead of "
                     f"{LR * old.factor(6):.2e}; --max-steps {STEPS} keeps the checkpoint's plan"], resumed.stdout
    lrs = {r["step"]: r["lr"] for r in read_metrics(out)}
    assert sorted(lrs) == list(range(1, 9))
    for step in (7, 8):
        assert lrs[step] == pytest.approx(LR * new.factor(step - 1), rel=1e-12), step

    again = setup.train(setup.copy_run(tmp_path / "same", 9), "--max-steps", STEPS)
    assert_succeeded(again)
    assert not [line for line in again.stdout.splitlines() if "LR schedule" in line], again.stdout


def test_a_resume_under_another_zero_stage_is_refused_in_one_line(setup: Setup, tmp_path: Path) -> None:
    """A ZeRO-3 run resumed with ``train.zero_stage: 2``, and a ZeRO-2 run resumed with 3: one line
    naming the checkpoint, both stages and the setting that resumes it, before any model is built
    (before: 290 lines ending in DeepSpeed's bare ``AssertionError``); its checkpoints stay as they were."""
    zero3 = setup.copy_run(tmp_path / "zero3", 6)
    zero2 = tmp_path / "zero2"
    assert_succeeded(setup.train(zero2, "--set", "train.zero_stage=2", "--max-steps", 1))
    for run, saved, now in ((zero3, 3, 2), (zero2, 2, 3)):
        before = {path: path.read_bytes() for path in (run / CHECKPOINTS_DIR).rglob("*") if path.is_file()}
        refused = setup.train(run, "--set", f"train.zero_stage={now}", "--max-steps", 8)
        assert refused.returncode != 0
        tag = Checkpoints(run / CHECKPOINTS_DIR).latest()
        assert "Traceback" not in refused.stderr, refused.stderr[-3000:]
        assert [line for line in refused.stderr.splitlines() if line.startswith("error: ")] == [
            f"error: cannot resume {run / CHECKPOINTS_DIR / tag}: it was saved under ZeRO stage {saved} and this run "
            f"trains with train.zero_stage {now} (DeepSpeed loads a checkpoint into its own stage only); resume with "
            f"train.zero_stage {saved} (--set train.zero_stage={saved}), or train into a new --out"], refused.stderr
        assert {path: path.read_bytes() for path in (run / CHECKPOINTS_DIR).rglob("*") if path.is_file()} == before
