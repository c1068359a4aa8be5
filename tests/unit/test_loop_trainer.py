"""The trainer on built parts, in this process: a one-process gloo group, the tiny profile, a small
cache, DeepSpeed's ZeRO-3 engine on the CPU (what torchrun would start, without the process start).

The run's builder (janus_train.build) makes the parts from the profile, the trainer
runs them, its policies act after each step: records logged, a checkpoint every ``save_every``
steps and at the end, and a second trainer on the same run directory resumes after the last
saved step. The two-process runs and the command's lines are tests/e2e/test_train.py.
"""

from __future__ import annotations

import importlib
import json
import socket
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch.distributed as dist

from helpers.shared_caches import SMALL_SHARDS
from helpers.training import write_train_profile
from janus_core.profile import load_profile
from janus_train.build import build_parts
from janus_train.checkpoint.store import tag_name
from janus_train.config import load_train_settings
from janus_train.data.sources import parse_cache_sources
from janus_train.loop.trainer import Trainer
from pipelines.distributed import init_distributed

STEPS, SAVE_EVERY = 3, 2


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def one_process(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """This process as rank 0 of a one-process group (torchrun's variables), left again afterwards.

    DeepSpeed's shared-memory all-reduce kernel is left out: loading the JIT-built op runs ninja, a
    process this tier refuses, and one process reduces nothing (gloo does what there is). DeepSpeed's
    CPU accelerator counts the node's devices from ``LOCAL_SIZE``, else by running numactl. The
    accelerator is named here, so the test session's later launches do not inherit the one
    init_distributed would set for good."""
    comm = importlib.import_module("deepspeed.comm.torch")  # the package's ``torch`` is torch itself

    monkeypatch.setattr(comm, "build_shm_op", lambda: None)
    for name, value in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "RANK": "0",
                        "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "LOCAL_SIZE": "1",
                        "DS_ACCELERATOR": "cpu"}.items():
        monkeypatch.setenv(name, value)
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


def trainer_on(profile: Path, cache: Path, run: Path) -> Trainer:
    prof = load_profile(str(profile))
    device = init_distributed(prof.device)
    return Trainer(build_parts(prof, load_train_settings(prof), run, device, cache=parse_cache_sources([str(cache)])))


def test_a_one_process_run_trains_logs_saves_and_resumes_after_its_last_checkpoint(
        one_process: None, small_shards_cache: Callable[[str], Path], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    profile = write_train_profile(tmp_path / "tiny.yaml", cache=SMALL_SHARDS,
                                  train={"max_steps": STEPS, "save_every": SAVE_EVERY, "live_check_every": 0})
    cache, run = small_shards_cache("zarr"), tmp_path / "run"

    trainer = trainer_on(profile, cache, run)
    assert trainer.resume() is False
    records = trainer.train()
    trainer.save()
    trainer.close()
    assert [r["step"] for r in records] == [1, 2, 3]
    assert all(r["loss"] > 0 and (r["nonfinite_skips"], r["damaged_skips"]) == (0, 0) for r in records)
    logged = [json.loads(line) for line in trainer.parts.layout.metrics.read_text().splitlines()]
    assert [r["step"] for r in logged] == [1, 2, 3]
    assert [line.split()[1] for line in capsys.readouterr().out.splitlines() if line.startswith("step ")] == \
        ["1/3", "2/3", "3/3"]
    assert trainer.checkpoints.tags() == [tag_name(3), tag_name(2)]
    assert trainer.checkpoints.latest() == tag_name(3)
    samples_per_step = trainer.stepping.samples_per_step  # micro_batch 1 x grad_accum 2 x 1 process
    assert samples_per_step == 2

    again = trainer_on(profile, cache, run)
    assert again.resume() is True
    progress = again.progress
    assert (progress.step, progress.epoch, progress.position) == (3, 0, 3 * samples_per_step)
    assert again.train() == []  # max_steps reached: nothing more to run
    again.close()
