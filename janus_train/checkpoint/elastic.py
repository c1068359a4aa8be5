"""Resuming a run, on the same or another number of processes: what may change, and the
conversion of a ZeRO-3 checkpoint to a new world size.

The data position is global (samples consumed of the epoch's global sequence, see
:mod:`janus_train.data.mixture`), so it means the same on any world; what must not change is the
sequence itself (sources, sizes, weights, seed) and the step size, ``samples_per_step`` =
``micro_batch x grad_accum x world``: with another global batch the LR schedule and the losses
would not continue the run. A webdataset cache streams each rank its own shards, so its
position is only meaningful on the same world.

ZeRO-3 partitions weights and Adam moments over the ranks that saved them. DeepSpeed's own tool
(``deepspeed.checkpoint.ds_to_universal``) turns such a checkpoint into a *universal* one (one
file per parameter and state), which an engine built with ``checkpoint.load_universal`` loads on
any world size. :func:`universal_checkpoint` runs it once, on rank 0, next to the checkpoint.
"""

from __future__ import annotations

import contextlib
import io
import os
import random
import shutil
import sys
from argparse import Namespace
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from janus_core.plural import plural
from janus_core.system.files import replace_directory
from janus_train.checkpoint.store import UNIVERSAL_SUFFIX, directory_problem, record_directory


class ResumeError(ValueError):
    """A run cannot continue the checkpoint in its run directory (one line: what differs and what works)."""


@dataclass(frozen=True)
class DataLayout:
    """What a data position means, stored with every checkpoint."""

    world: int
    micro_batch: int
    grad_accum: int
    n_samples: int  # samples of an epoch's global sequence
    seed: int
    streaming: bool = False
    sources: tuple[tuple[str, int, float], ...] = ()  # (name, samples, weight) of every cache

    @property
    def samples_per_step(self) -> int:
        return self.micro_batch * self.grad_accum * self.world

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "sources": [list(s) for s in self.sources],
                "samples_per_step": self.samples_per_step}

    @staticmethod
    def global_position(state: dict[str, Any]) -> int:
        """The checkpoint's position in samples of the epoch's global sequence (checkpoints made
        before positions were global counted one rank's samples)."""
        layout = state.get("data_layout", {})
        if "samples_per_step" in layout:
            return int(state["position"])
        return int(state["position"]) * int(layout.get("world", 1))


def _batch(layout: dict[str, Any]) -> str:
    return (f"{layout['micro_batch']} x {layout['grad_accum']} x {plural(layout['world'], 'process')} "
            f"= {layout['micro_batch'] * layout['grad_accum'] * layout['world']} samples")


def check_resumable(tag_dir: Path, state: dict[str, Any], now: DataLayout, zero_stage: int | None = None) -> None:
    """Raise :class:`ResumeError` unless a run laid out as ``now`` (under ZeRO stage ``zero_stage``)
    can continue the checkpoint ``tag_dir`` whose client state is ``state``; the message names
    checkpoint vs now and the setting that would make it fit."""
    saved = state.get("data_layout", {})
    where = f"cannot resume {tag_dir}"
    saved_stage = state.get("zero_stage")
    if zero_stage is not None and saved_stage is not None and saved_stage != zero_stage:
        raise ResumeError(f"{where}: it was saved under ZeRO stage {saved_stage} and this run trains with "
                          f"train.zero_stage {zero_stage} (DeepSpeed loads a checkpoint into its own stage only); "
                          f"resume with train.zero_stage {saved_stage} (--set train.zero_stage={saved_stage}), or "
                          "train into a new --out")
    for key, what in (("seed", "seed"), ("n_samples", "samples per epoch")):
        if saved.get(key) != getattr(now, key):
            raise ResumeError(f"{where}: the data differ in {what} (checkpoint {saved.get(key)}, now {getattr(now, key)})")
    saved_sources = [tuple(s) for s in saved.get("sources", [])]
    if saved_sources and saved_sources != [tuple(s) for s in now.sources]:
        describe = lambda sources: ", ".join(f"{n}={size}:{w:g}" for n, size, w in sources)  # noqa: E731
        raise ResumeError(f"{where}: the caches differ (checkpoint {describe(saved_sources)}; "
                          f"now {describe(now.sources)})")
    saved_step = saved["micro_batch"] * saved["grad_accum"] * saved["world"]
    if saved_step != now.samples_per_step:
        keeping = grad_accum_keeping(saved, now.micro_batch, now.world)
        fix = (f"grad_accum {keeping} keeps it (train.resume_grad_accum: adapt sets it)" if keeping is not None else
               f"no grad_accum keeps it with micro_batch {now.micro_batch} on {plural(now.world, 'process')}")
        raise ResumeError(f"{where}: the global batch differs (checkpoint {_batch(saved)}, now "
                          f"{_batch(asdict(now))}); {fix}")
    if saved["world"] != now.world and (now.streaming or saved.get("streaming")):
        raise ResumeError(f"{where}: it was saved on {plural(saved['world'], 'process')} and a webdataset (streaming) "
                          f"cache deals its shards to ranks, so {plural(now.world, 'process')} would repeat or skip "
                          f"samples; resume on {plural(saved['world'], 'process')}, or train from a zarr cache, which "
                          "resumes on any")


def grad_accum_keeping(saved: dict[str, Any], micro_batch: int, world: int) -> int | None:
    """The grad_accum with which ``micro_batch`` x it x ``world`` processes is the global batch of the
    checkpoint whose data layout is ``saved`` (None: no whole number does)."""
    saved_step = saved["micro_batch"] * saved["grad_accum"] * saved["world"]
    per_accum = micro_batch * world
    return saved_step // per_accum if saved_step % per_accum == 0 else None


@dataclass(frozen=True)
class GradAccum:
    """The grad_accum a resumed run takes, and the one line that says so when it is not the profile's."""

    value: int
    note: str | None = None

    @classmethod
    def for_resume(cls, checkpoints: Path, tag: str, micro_batch: int, grad_accum: int, world: int) -> GradAccum:
        """``grad_accum`` changed, where that alone keeps checkpoint ``tag``'s global batch on this run's
        ``world`` and ``micro_batch`` (``train.resume_grad_accum: adapt``): the steps, the LR schedule and
        the data position then continue the run. Otherwise the profile's (:func:`check_resumable`
        refuses a global batch it does not keep)."""
        saved = read_client_state(checkpoints, tag)["data_layout"]
        keeping = grad_accum_keeping(saved, micro_batch, world)
        if keeping is None or keeping == grad_accum:
            return cls(grad_accum)
        processes = plural(world, "process")
        return cls(keeping, f"note: grad_accum {keeping} instead of the profile's {grad_accum} on {processes} keeps "
                            f"the global batch of checkpoint {tag} ({_batch(saved)}); "
                            "train.resume_grad_accum: keep refuses such a resume instead")


def rng_states() -> dict[str, Any]:
    """This process's random generator states (stored per rank in a checkpoint)."""
    states: dict[str, Any] = {"python": random.getstate(), "numpy": np.random.get_state(),
                              "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def set_rng_states(states: dict[str, Any]) -> None:
    random.setstate(states["python"])
    np.random.set_state(states["numpy"])
    torch.set_rng_state(states["torch"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


@dataclass(frozen=True)
class ResumePoint:
    """The checkpoint a run continues: its tag, the trainer state saved with it, and whether it
    was saved on another number of processes (then it is loaded as a universal checkpoint)."""

    tag: str
    state: dict[str, Any]
    saved_world: int
    world: int

    @property
    def elastic(self) -> bool:
        return self.saved_world != self.world

    @classmethod
    def find(cls, checkpoints: Path, tag: str, now: DataLayout, zero_stage: int | None = None) -> ResumePoint:
        """Checkpoint ``tag`` (the intact one :meth:`Checkpoints.resumable` chose) checked against the
        run's layout and ZeRO stage (:class:`ResumeError` if the run cannot continue it); cheap, so it
        runs before any model or engine is built."""
        state = read_client_state(checkpoints, tag)
        check_resumable(checkpoints / tag, state, now, zero_stage)
        return cls(tag, state, int(state["data_layout"]["world"]), now.world)


def read_client_state(checkpoints: Path, tag: str) -> dict[str, Any]:
    """The trainer's state saved with checkpoint ``tag`` (rank 0's copy), read before any engine
    exists: the world it was saved on decides how the engine must load it."""
    files = sorted((checkpoints / tag).glob("*model_states.pt"))
    if not files:
        raise ResumeError(f"{checkpoints / tag} holds no DeepSpeed model states (*model_states.pt)")
    first = next((f for f in files if "_rank_0_" in f.name or f.name.startswith("mp_rank_00")), files[0])
    try:
        # mmap: the file also holds this rank's share of frozen weights, which are not needed here.
        state = torch.load(first, map_location="cpu", weights_only=False, mmap=True)
    except Exception as err:  # a damaged file: name it (its own error is a long traceback)
        raise ResumeError(f"{first}: cannot be read ({type(err).__name__}: {err})") from None
    client = {k: v for k, v in state.items() if k in ("step", "epoch", "position", "data_layout", "rng",
                                                       "nonfinite_skips")}
    if "data_layout" not in client:
        raise ResumeError(f"{first} holds no janus data position (not a janus checkpoint?)")
    stage = (state.get("ds_config") or {}).get("zero_optimization", {}).get("stage")
    if stage is not None:  # DeepSpeed records the config a checkpoint was saved under
        client["zero_stage"] = int(stage)
    return client


def universal_checkpoint(checkpoints: Path, tag: str, rank: int, saved_world: int, world: int) -> str:
    """The tag of ``tag`` converted to a universal checkpoint (``<tag>_universal``): rank 0
    converts it once (into a temporary directory, checksummed like every checkpoint and renamed
    when complete, so a crash leaves no half-converted tag) and prints one line; other ranks must
    wait (a barrier) before loading.

    A conversion left by an earlier resume is verified against its ``checksums.json`` first: a
    damaged, truncated or unrecorded one is converted again from ``tag`` (which the resume
    verified intact), with one warning line, instead of loading shifted weights or crashing."""
    universal = tag + UNIVERSAL_SUFFIX
    target = checkpoints / universal
    if rank == 0 and target.is_dir() and (problem := directory_problem(target)) is not None:
        print(f"warning: {target} is damaged ({problem}); converting checkpoint {tag} again", file=sys.stderr,
              flush=True)
        shutil.rmtree(target)
    if rank == 0 and not target.is_dir():
        from deepspeed.checkpoint import ds_to_universal

        partial = checkpoints / (universal + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        args = Namespace(input_folder=str(checkpoints / tag), output_folder=str(partial),
                         num_extract_workers=max(1, min(8, (os.cpu_count() or 1) // 2)),
                         num_merge_workers=max(1, min(4, (os.cpu_count() or 1) // 4)),
                         keep_temp_folder=False, strict=True, inject_missing_state=False)
        chatter = io.StringIO()  # the converter prints a dozen progress lines and tqdm bars
        try:
            with contextlib.redirect_stdout(chatter), contextlib.redirect_stderr(chatter):
                ds_to_universal.main(args)
        except BaseException:
            print(chatter.getvalue(), flush=True)
            raise
        # It names its output in ``latest_universal``; janus loads by explicit tag instead.
        (checkpoints / "latest_universal").unlink(missing_ok=True)
        record_directory(partial)
        replace_directory(partial, target)
        print(f"converted checkpoint {tag} (saved on {plural(saved_world, 'process')}) for {world} with DeepSpeed's "
              f"ds_to_universal into {target}", flush=True)
    return universal


def repair_universal_load(zero_optimizer: Any, last_lrs: list[float]) -> None:
    """Undo two side effects of DeepSpeed 0.19's ZeRO-3 universal loader on the wrapped torch
    optimizer (``zero_optimizer.optimizer``), so the next step is the uninterrupted run's:

    * it gives every param group the first group's hyper-parameters: each group gets its own LR
      back from the LR schedule (``last_lrs``, restored with the checkpoint);
    * it stores one ``step`` tensor object in every parameter's Adam state; torch's Adam(W)
      increments it in place, so with several sub-groups the step count (and Adam's bias
      correction) would run ahead by one per sub-group and step. Each state gets its own copy.
    """
    optimizer = zero_optimizer.optimizer
    for group, lr in zip(optimizer.param_groups, last_lrs):
        group["lr"] = lr
    for state in optimizer.state.values():
        if torch.is_tensor(state.get("step")):
            state["step"] = state["step"].clone()

