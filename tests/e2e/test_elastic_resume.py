"""Elastic resume: a run continues on another number of processes with the
sample order and, within float32 tolerance, the losses of an uninterrupted run.

Real components: a zarr cache of 3 episodes x 4 steps = 12 samples (the session's,
helpers.shared_runs), launches of the trainer by torch's elastic agent (helpers.training.train_on_ranks),
DeepSpeed ZeRO-3 over gloo. Every run takes steps of 4 samples (micro-batch 1 x accumulation 2 x 2
processes, or x 4 x 1 process), so an epoch is 3 steps and step 4 is the first
of epoch 1; 8 steps with a checkpoint at step 4. The runs log each step's sample keys in the order
of the global sequence.

* A: 2 processes, 8 steps; B: 1 process, 8 steps (the same global batch: the same run).
* 2 -> 1: A's step-4 checkpoint continued on 1 process (DeepSpeed's universal checkpoint) with the
  cache read in place from a bucket of a real S3 server (``janus-cache push``, then ``--cache
  s3://...``: elastic resume from a bucket as from disk); its conversion is the one the damage tests
  damage, which resume from the local cache.
* 1 -> 2: B's step-4 checkpoint continued on 2 processes.

The resume rule as a function is tests/unit/test_resume_rule.py.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from helpers.profiles import write_test_profile
from helpers.s3_server import S3Server, janus_cache
from helpers.s3_server import succeeded as command_succeeded
from helpers.shared_runs import TinyTraining
from helpers.training import train_on_ranks
from janus_core.sample_data import write_sample_data
from janus_train.checkpoint.elastic import GradAccum, read_client_state

STEPS, SAVE_AT = 8, 4
TIMEOUT_S = 600
# Gradients of the same samples summed in another order (other ranks, other micro-batches): float32
# rounding, carried through Adam for 4 steps (measured: <= 1e-7 relative). A step count one off in
# Adam's bias correction after the conversion (a DeepSpeed 0.19 loader side effect, repaired in
# janus_train.checkpoint.elastic) showed as 1.6e-4 at the first resumed update.
REL = 1e-5


def write_profile(path: Path, grad_accum: int, cache: dict | None = None) -> Path:
    write_test_profile(path, cache={"feature_dtype": "float32", **(cache or {})})
    data = yaml.safe_load(path.read_text())
    data["train"].update({"micro_batch": 1, "grad_accum": grad_accum, "epochs": 100, "max_steps": STEPS,
                          "warmup_ratio": 0.0, "lr_base": 2e-3, "lr_projector": 2e-3, "save_every": SAVE_AT,
                          "save_total_limit": 10, "log_every": 1, "num_workers": 0, "log_sample_keys": True})
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def train(out: Path, cache: Path | str, profile: Path, nproc: int, extra: list[str] | None = None,
          env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return train_on_ranks("--out", out, "--cache", cache, "--profile", profile, "--no-export", *(extra or []),
                          nproc=nproc, env=env)


def succeeded(result: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert result.returncode == 0, f"training failed:\n{result.stdout[-3000:]}\n{result.stderr[-5000:]}"
    return result


def metrics(run: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def continue_from(run: Path, out: Path) -> Path:
    """A run directory holding only ``run``'s step-4 checkpoint: what a run stopped after step 4 leaves."""
    tag = f"step{SAVE_AT:08d}"
    (out / "checkpoints").mkdir(parents=True)
    shutil.copytree(run / "checkpoints" / tag, out / "checkpoints" / tag)
    (out / "checkpoints" / "latest").write_text(tag)
    (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in metrics(run)[:SAVE_AT]))
    return out


@dataclass(frozen=True)
class Setup:
    cache: Path
    two: Path  # profile for 2 processes (grad_accum 2)
    one: Path  # profile for 1 process (grad_accum 4)
    run_two: Path  # A
    run_one: Path  # B


@pytest.fixture(scope="module")
def setup(three_episodes: TinyTraining, tmp_path_factory: pytest.TempPathFactory) -> Setup:
    root = tmp_path_factory.mktemp("elastic")
    two, one = write_profile(root / "two.yaml", grad_accum=2), write_profile(root / "one.yaml", grad_accum=4)
    cache = three_episodes.fp32_cache  # the session's: the same cache settings as these profiles
    succeeded(train(root / "A", cache, two, nproc=2))
    succeeded(train(root / "B", cache, one, nproc=1))
    return Setup(cache, two, one, root / "A", root / "B")


@dataclass(frozen=True)
class Continued:
    out: Path
    result: subprocess.CompletedProcess[str]


@pytest.fixture(scope="module")
def two_on_one(setup: Setup, s3_server: S3Server, tmp_path_factory: pytest.TempPathFactory) -> Continued:
    """A's step-4 checkpoint continued on 1 process to step 8, the cache read from a bucket (its
    conversion stays in the run). Read-only: copy what a test changes."""
    url = f"{s3_server.url('elastic')}/{setup.cache.name}"  # the run names its cache after it
    command_succeeded(janus_cache(s3_server, "push", setup.cache, url))
    out = continue_from(setup.run_two, tmp_path_factory.mktemp("two-on-one") / "run")
    return Continued(out, succeeded(train(out, url, setup.one, nproc=1, env=s3_server.env())))


def same_run(got: list[dict[str, Any]], want: list[dict[str, Any]]) -> None:
    assert [r["step"] for r in got] == [r["step"] for r in want]
    for g, w in zip(got, want):
        assert g["sample_keys"] == w["sample_keys"], g["step"]
        assert g["epoch"] == w["epoch"]
        assert g["lr"] == pytest.approx(w["lr"], rel=1e-9)
        for name in ("loss", "token_loss", "action_loss"):
            assert g[name] == pytest.approx(w[name], rel=REL), (g["step"], name)
        assert g["grad_norm"] == pytest.approx(w["grad_norm"], rel=REL), g["step"]


def test_one_and_two_processes_with_the_same_global_batch_are_the_same_run(setup: Setup) -> None:
    """The global sequence and the step size do not depend on the world: B (1 process, accumulation
    4) reads A's (2 processes, accumulation 2) samples, step by step, with A's losses; every
    sample of an epoch once (steps 1..3: all 12)."""
    a, b = metrics(setup.run_two), metrics(setup.run_one)
    assert len({k for r in a[:3] for k in r["sample_keys"]}) == 12
    assert [r["epoch"] for r in a] == [0, 0, 0, 1, 1, 1, 2, 2]
    same_run(b, a)


def test_two_processes_continue_on_one_reading_the_cache_from_a_bucket(setup: Setup, two_on_one: Continued) -> None:
    """2 -> 1 from a bucket: the checkpoint is converted once with DeepSpeed's ds_to_universal (one
    line), then steps 5..8 read the uninterrupted local run's samples, in place from the bucket, with
    its losses (weights and Adam moments came along: without the moments the first resumed step's
    loss would differ already)."""
    out, result = two_on_one.out, two_on_one.result
    assert "converted checkpoint step00000004 (saved on 2 processes) for 1" in result.stdout
    assert "resumed at step 4 (epoch 1, sample 4 of the epoch)" in result.stdout
    assert (out / "checkpoints" / "step00000004_universal" / "zero").is_dir()
    same_run(metrics(out)[SAVE_AT:], metrics(setup.run_two)[SAVE_AT:])


def test_one_process_continues_on_two(setup: Setup, tmp_path: Path) -> None:
    """1 -> 2: the reverse, compared with both uninterrupted runs."""
    out = continue_from(setup.run_one, tmp_path / "run")
    result = succeeded(train(out, setup.cache, setup.two, nproc=2))
    assert "converted checkpoint step00000004 (saved on 1 process) for 2" in result.stdout
    resumed = metrics(out)[SAVE_AT:]
    same_run(resumed, metrics(setup.run_one)[SAVE_AT:])
    same_run(resumed, metrics(setup.run_two)[SAVE_AT:])
    # Checkpoints written after the resume are of the new world, and resume plainly.
    assert (out / "checkpoints" / "step00000008").is_dir()


def test_the_same_profile_on_one_process_continues_with_the_grad_accum_that_keeps_the_global_batch(
        setup: Setup, tmp_path: Path) -> None:
    """A's profile (grad_accum 2) resumed on 1 process would take steps of 2 samples;
    grad_accum 4 keeps A's 4, said in one line, and the run is A's (before: refused naming grad_accum 4)."""
    out = continue_from(setup.run_two, tmp_path / "run")
    result = succeeded(train(out, setup.cache, setup.two, nproc=1))
    notes = [line for line in result.stdout.splitlines() if "grad_accum" in line]
    assert notes == ["note: grad_accum 4 instead of the profile's 2 on 1 process keeps the global batch of checkpoint "
                     "step00000004 (1 x 2 x 2 processes = 4 samples); train.resume_grad_accum: keep refuses such a "
                     "resume instead"], result.stdout
    assert "training 8 steps of 4 samples on 1 process" in result.stdout
    assert "resumed at step 4 (epoch 1, sample 4 of the epoch)" in result.stdout
    same_run(metrics(out)[SAVE_AT:], metrics(setup.run_two)[SAVE_AT:])
    # The checkpoints it writes hold the grad_accum it ran with.
    state = read_client_state(out / "checkpoints", "step00000008")
    assert state["data_layout"]["grad_accum"] == 4 and state["data_layout"]["world"] == 1


def test_another_global_batch_is_refused_in_one_line_naming_the_grad_accum_that_keeps_it(
        setup: Setup, tmp_path: Path) -> None:
    """With ``train.resume_grad_accum: keep``, resuming with another global batch is one
    ``error:`` line, not a traceback; it says checkpoint vs now and the grad_accum that keeps the
    global batch, before any model is built."""
    keep = tmp_path / "keep.yaml"
    data = yaml.safe_load(setup.two.read_text())
    data["train"]["resume_grad_accum"] = "keep"
    keep.write_text(yaml.safe_dump(data, sort_keys=False))
    out = continue_from(setup.run_two, tmp_path / "run")
    result = train(out, setup.cache, keep, nproc=1)  # grad_accum 2 on 1 process: 2 samples per step
    assert result.returncode != 0
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr[-3000:]
    assert ("the global batch differs (checkpoint 1 x 2 x 2 processes = 4 samples, now 1 x 2 x 1 process = "
            "2 samples); grad_accum 4 keeps it (train.resume_grad_accum: adapt sets it)") in errors[0]
    # No traceback from the ranks (torchrun's own ChildFailedError summary is the launcher's).
    assert "janus_train/" not in result.stderr and "ResumeError" not in result.stderr
    assert not (out / "checkpoints" / "step00000004_universal").exists()


def test_the_grad_accum_a_resume_takes_keeps_the_checkpoints_global_batch_where_one_does(setup: Setup) -> None:
    """A's step-4 checkpoint: 1 x 2 x 2 processes = 4 samples per step."""
    checkpoints, tag = setup.run_two / "checkpoints", f"step{SAVE_AT:08d}"

    def taken(micro_batch: int, grad_accum: int, world: int) -> tuple[int, bool]:
        accum = GradAccum.for_resume(checkpoints, tag, micro_batch, grad_accum, world)
        return accum.value, accum.note is not None

    assert taken(1, 2, 2) == (2, False)  # the same run
    assert taken(1, 2, 1) == (4, True)
    assert taken(1, 8, 4) == (1, True)
    assert taken(2, 2, 1) == (2, False)  # micro-batch 2 x 2: the global batch already
    assert taken(2, 1, 1) == (2, True)
    assert taken(1, 2, 3) == (2, False)  # none keeps 4 samples on 3 processes: the refusal stays
    assert GradAccum.for_resume(checkpoints, tag, 1, 2, 1).note == (
        "note: grad_accum 4 instead of the profile's 2 on 1 process keeps the global batch of checkpoint step00000004 "
        "(1 x 2 x 2 processes = 4 samples); train.resume_grad_accum: keep refuses such a resume instead")


def test_a_webdataset_run_resumed_on_another_world_is_refused_in_one_line(tmp_path: Path) -> None:
    """A webdataset cache deals its shards to ranks, so a stream position means something only on
    the world that made it: 2 -> 1 processes is refused naming what works; no conversion happens."""
    from pipelines.precompute_run import Options, run

    # 4 shards of 2 samples: each of 2 ranks streams 2 shards.
    two = write_profile(tmp_path / "two.yaml", grad_accum=2, cache={"samples_per_shard": 2})
    one = write_profile(tmp_path / "one.yaml", grad_accum=4, cache={"samples_per_shard": 2})
    data = write_sample_data(tmp_path / "data", episodes=2, steps=4, seed=0)
    cache = tmp_path / "wds"
    assert run(Options(data, cache, profile=str(two), cache_format="wds", workers=1)) == 0
    out = tmp_path / "run"
    succeeded(train(out, cache, two, nproc=2, extra=["--max-steps", "2"]))
    result = train(out, cache, one, nproc=1, extra=["--max-steps", "4"])
    assert result.returncode != 0
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr[-3000:]
    assert "saved on 2 processes and a webdataset (streaming) cache deals its shards to ranks" in errors[0]
    assert "resume on 2 processes, or train from a zarr cache" in errors[0]
    assert not list((out / "checkpoints").glob("*_universal"))


@pytest.mark.parametrize("damage", ["flipped byte", "truncated"])
def test_a_damaged_universal_checkpoint_is_converted_again_with_one_warning(
        setup: Setup, two_on_one: Continued, tmp_path: Path, damage: str) -> None:
    """A resume on 1 process converts A's step-4 checkpoint (and checksums the
    conversion: the 2 -> 1 run's); the largest converted file is then damaged in a run directory
    stopped at step 4. The next resume on 1 process verifies the conversion, says in one line what
    is wrong with it, converts the intact ZeRO checkpoint again and continues with the
    uninterrupted run's losses (the damaged weights would shift them; a truncated file would crash
    the loader)."""
    from janus_train.checkpoint.store import directory_problem

    out = continue_from(setup.run_two, tmp_path / "run")
    universal = out / "checkpoints" / f"step{SAVE_AT:08d}_universal"
    shutil.copytree(two_on_one.out / "checkpoints" / universal.name, universal)
    assert directory_problem(universal) is None  # recorded, and intact
    victim = max(universal.rglob("fp32.pt"), key=lambda p: p.stat().st_size)
    name = victim.relative_to(universal).as_posix()
    raw = victim.read_bytes()
    if damage == "truncated":
        victim.write_bytes(raw[: len(raw) // 2])
        problem = f"file {name}: truncated ({len(raw) // 2} of {len(raw)} bytes)"
    else:
        victim.write_bytes(raw[: len(raw) // 2] + bytes([raw[len(raw) // 2] ^ 0x01]) + raw[len(raw) // 2 + 1:])
        problem = f"file {name}: checksum"

    result = succeeded(train(out, setup.cache, setup.one, nproc=1))
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert warnings == [f"warning: {universal} is damaged ({problem}); converting checkpoint step{SAVE_AT:08d} "
                        "again"], result.stderr[-3000:]
    assert f"converted checkpoint step{SAVE_AT:08d} (saved on 2 processes) for 1" in result.stdout
    assert directory_problem(universal) is None
    same_run(metrics(out)[SAVE_AT:], metrics(setup.run_two)[SAVE_AT:])
