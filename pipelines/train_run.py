"""The run's half of ``pipelines.train``, imported once the start checks passed
(:mod:`pipelines.train_start`): it loads torch, transformers and DeepSpeed, joins the process
group, checks the caches on rank 0, records the start, builds the run's parts and trains.

Start-up check: before any model is built, rank 0 runs verify's schema and freshness checks of
every cache against the training profile and tells every rank the verdict; a refused cache ends
all ranks with exit code 1 and the one-line reason (which names the cache and the differing field).
With ``--data`` (the dataset as precompute was given it; one cache), rank 0 also runs verify's
dataset comparison (completeness against a fresh index: per-episode frames, texts and actions), so a
cache made stale by an edited description, instruction or image is refused naming the episode and
the file. A reference checkpoint to start from (``train.init_from``) is checked here too.

The run directory describes itself (``janus_train.run.layout``): at start rank 0 writes the resolved
profile (``profile.yaml``, after ``extends`` and ``--set KEY=VALUE`` overrides) and appends the
command line, versions and cache digests to ``run.json`` (``janus_train.run.provenance``). Rank 0's
console is also appended to ``train.log``.

The run's parts (tokenizer, data, checkpoints, model, engine) are built by :func:`janus_train.build.build_parts`
and run by :class:`janus_train.loop.trainer.Trainer`; the user errors each end every rank with one
line, mapped in one place (:data:`USER_ERRORS`, :func:`error_line`).

Output: rank 0 prints one line per logged step (``janus_train.loop.logs``); warnings that libraries
raise on every step are filtered here, each with its reason. A non-finite step
(``janus_train.loop.nonfinite``) ends every rank with exit code 1 and one ``error:`` line from rank 0.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import warnings
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import NoReturn

import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

from janus_cache.store import DamagedData
from janus_cache.store.remote.errors import RemoteError
from janus_core.plural import plural
from janus_core.profile import CacheSettings, Profile
from janus_core.system.disk_space import NoRoom
from janus_train.build import TooFewSamples, build_parts
from janus_train.checkpoint.elastic import ResumeError
from janus_train.checkpoint.export import export
from janus_train.checkpoint.reference import ReferenceCheckpointError, run_model_config
from janus_train.checkpoint.store import NoIntactCheckpoint, tag_name
from janus_train.config import TrainSettings
from janus_train.data.damaged import DamagedSample, StalledSample
from janus_train.data.live_check import LiveCheckError
from janus_train.data.sources import CacheSource
from janus_train.evals.evaluations import Evaluations
from janus_train.loop.logs import ConsoleCopy
from janus_train.loop.nonfinite import NonFiniteStep
from janus_train.loop.preemption import PREEMPTED_EXIT_CODE, Preemption, stopped_message
from janus_train.loop.trainer import Trainer
from janus_train.loop.validation import ValidationError
from janus_train.run.layout import RunLayout
from janus_train.run.provenance import append_start, set_aside_damaged_record, write_profile
from pipelines.cpu_comm_op import CommOpBuildFailed
from pipelines.distributed import (
    Control,
    Progress,
    RankFailed,
    Ranks,
    environment_outside_ranks,
    fail_alike,
    init_distributed,
    lock_on_main,
    usable_cores,
)
from pipelines.library_output import library_chatter_hidden
from pipelines.train_start import START_ERRORS, Refused, first_refusal, missing_cache


def quiet_library_warnings() -> None:
    """Warnings a user can do nothing about, which would otherwise repeat on every rank and step."""
    # DeepSpeed 0.19's ZeRO-3 gathers and reduce-scatters with torch's deprecated collective names;
    # torch warns at every call (dozens of lines per step). The fix is DeepSpeed's, not the user's.
    warnings.filterwarnings("ignore", category=FutureWarning,
                            message=r"`torch\.distributed\.(all_gather_into_tensor|reduce_scatter_tensor)` is deprecated")
    # torch checks the loader's worker count at every DataLoader (each epoch and evaluation, on
    # every rank), and "once" does not hold: any library that changes the warning filters clears
    # Python's once-registry. The trainer says it in one line instead (loader_note).
    warnings.filterwarnings("ignore", category=UserWarning, message=r"This DataLoader will create \d+ worker processes")


def loader_note(num_workers: int, local_processes: int) -> str | None:
    """One line when a process's loader workers outnumber its cores (torch's check, said once)."""
    cores = usable_cores()
    if num_workers <= cores:
        return None
    return (f"note: train.num_workers is {num_workers} loader workers per process ({num_workers * local_processes} on "
            f"this node) for {plural(cores, 'core')}; if the step line's wait % is high, lower train.num_workers")


def quiet_export(checkpoints: Path, out: Path, prof: Profile, settings: TrainSettings) -> Path:
    """:func:`export` without its libraries' chatter (the caller prints one summary line)."""
    with library_chatter_hidden(NoRoom):
        return export(checkpoints, out, prof, run_model_config(settings))


def cache_refusal(cache: Path, profile: Profile) -> str | None:
    """Why ``cache`` must not be trained on with ``profile`` (None when it may)."""
    from janus_cache.verify import CacheVerificationError, check_cache_for_training

    if (missing := missing_cache(cache)) is not None:  # checked at start; gone since
        return missing
    try:
        check_cache_for_training(cache, profile)
    except CacheVerificationError as err:
        return str(err)
    return None


def dataset_refusal(cache: Path, data: str, settings: CacheSettings) -> str | None:
    """Why ``cache`` is stale against the dataset ``data`` (None when it is not): verify's
    completeness check against the dataset indexed now, with the cache's window history (the
    cache's index store is reused while the dataset's files are unchanged)."""
    from janus_cache.store import load_manifest
    from janus_cache.verify import check_completeness, dataset_indexes, failure_message, index_store_of

    manifest = load_manifest(cache)
    history = manifest.window.history
    index, _ = dataset_indexes(data, history, history, settings.subinstruction_rule,
                               cache_dir=index_store_of(cache), recorded_names=manifest.dataset.sources)
    return failure_message(cache, [check_completeness(cache, index)]) or None


def record_start(layout: RunLayout, profile: Profile, settings: TrainSettings, world: int,
                 caches: list[Path]) -> None:
    """The run directory's description of this start: ``profile.yaml`` and an entry of ``run.json``
    (a damaged ``run.json`` kept aside first, said in one line)."""
    write_profile(layout, profile, settings)
    if (warning := set_aside_damaged_record(layout)) is not None:
        print(warning, file=sys.stderr, flush=True)
    append_start(layout, profile, world, caches, settings)


def record_outputs(trainer: Trainer, path: Path, n_samples: int) -> None:
    """Every rank computes (ZeRO-3 needs all of them); rank 0 writes ``path``."""
    from safetensors.torch import save_file

    dataset = trainer.data.dataset
    rows = list(range(min(n_samples, len(dataset))))
    outputs = trainer.outputs_on(rows)
    if trainer.rank == 0:
        keys = [dataset[row].key for row in rows]
        path.parent.mkdir(parents=True, exist_ok=True)
        save_file({k: v.contiguous() for k, v in outputs.items()}, str(path),
                  metadata={"keys": json.dumps(keys), "rows": json.dumps(rows), "step": str(trainer.progress.step)})


USER_ERRORS: tuple[type[Exception], ...] = (
    *START_ERRORS,  # a profile or cache read again here (a run directory's record, a mixture's caches)
    RankFailed, ReferenceCheckpointError, TooFewSamples, ResumeError, NoIntactCheckpoint, LiveCheckError,
    ValidationError,
    DamagedData,  # a table every rank reads whole at start (the same on every rank)
    RemoteError,  # a cache in a bucket that cannot be read (credentials, endpoint, connection)
    NonFiniteStep, DamagedSample, StalledSample, NoRoom,
    CommOpBuildFailed,  # DeepSpeed's CPU op could not be built (no compiler): the same on every rank
)
"""The failures a user can fix, each raised on every rank alike with its one line (a lock or a
rank-0 step that failed: :class:`RankFailed`, every rank alike too); anything else is a bug and
ends with its traceback."""


def error_line(err: Exception, profile: Profile | None) -> str:
    """The one ``error:`` line of a user error: a validation source that cannot be used is named
    with the profile that sets it."""
    if isinstance(err, ValidationError) and profile is not None:
        return f"{profile.source}: {err}"
    return str(err)


def hold_locks(held: contextlib.ExitStack, ranks: Ranks, out: Path, caches: list[CacheSource]) -> None:
    """For the whole run (released with ``held``): one writer per run directory, and a reader's lock
    on every cache read, so no precompute writes into one meanwhile."""
    control = Control(ranks)
    locks = [partial(lock_on_main, control, out)] + [
        partial(lock_on_main, control, source.path, exclusive=False, purpose=f"training run {out}")
        for source in caches]
    for take in locks:
        lock = take()
        if lock is not None:
            held.callback(lock.release)


def caches_refusal(ranks: Ranks, caches: list[CacheSource], data: str | None, prof: Profile) -> str | None:
    """Rank 0's verdict on the run's caches (every rank gets it): verify's schema and freshness
    checks of each, and with ``data`` the first cache's completeness against the dataset."""
    if not caches:
        return None
    control = Control(ranks)
    try:
        refusal = control.on_main(lambda: first_refusal(caches, partial(cache_refusal, profile=prof)))
        if refusal is None and data is not None:
            refusal = control.on_main(lambda: dataset_refusal(caches[0].path, data, prof.cache))
    except RankFailed as err:
        refusal = f"cannot check the cache(s) {', '.join(str(s.path) for s in caches)}: {err}"
    return refusal


def record_start_on_main(ranks: Ranks, out: Path, prof: Profile, settings: TrainSettings,
                         caches: list[CacheSource]) -> None:
    try:
        Control(ranks).on_main(lambda: record_start(RunLayout(out), prof, settings, ranks.world,
                                                    [s.path for s in caches]))
    except RankFailed as err:
        raise Refused(f"cannot record the run in {out} ({err}); its checkpoints are unchanged: fix that and run "
                      "the same command again") from None


def announce_start(trainer: Trainer, cache: CacheSettings, resumed: bool, local_world: int) -> None:
    """Rank 0's lines at the start: a resume's notes, what the run trains on and where its metrics go."""
    if trainer.resume_note:
        print(f"warning: {trainer.resume_note}", file=sys.stderr, flush=True)
    if resumed and trainer.parts.resume.grad_accum_note:
        print(trainer.parts.resume.grad_accum_note, flush=True)
    if trainer.lr_note:
        print(trainer.lr_note, flush=True)
    stepping, progress, sources = trainer.stepping, trainer.progress, trainer.data.sources
    validation = trainer.data.validation
    mixture = (" from " + ", ".join(f"{s.name} (weight {s.weight:g})" for s in sources)
               if len(sources) > 1 else "")
    print(f"training {plural(stepping.total_steps, 'step')} of {plural(stepping.samples_per_step, 'sample')} on "
          f"{plural(trainer.world, 'process')} ({plural(stepping.steps_per_epoch, 'step')} per epoch)"
          f"{mixture}, frames at {cache.resolution.name}"
          f"{' (the frozen ViT from the cache: only its mergers run)' if cache.vit_features else ''}"
          f", metrics in {trainer.parts.layout.metrics}"
          + (f"; resumed at step {progress.step} (epoch {progress.epoch}, sample {progress.position} "
             f"of the epoch)" if resumed else "")
          + (f"; validating on {validation.description}" if validation else ""),
          flush=True)
    note = loader_note(trainer.settings.num_workers, local_world)
    if note:
        print(note, flush=True)


def stop_preempted(trainer: Trainer, preemption: Preemption) -> NoReturn:
    """Every rank alike, after the stop signal's checkpoint was saved: rank 0 names the resume point."""
    if trainer.rank == 0:
        print(stopped_message(preemption.stopped_by, trainer.progress.step,
                              str(trainer.checkpoint_dir() / tag_name(trainer.progress.step))),
              file=sys.stderr, flush=True)
    dist.barrier()
    raise SystemExit(PREEMPTED_EXIT_CODE)


def export_on_main(trainer: Trainer, prof: Profile, settings: TrainSettings) -> None:
    """Rank 0 exports the last checkpoint; a full disk is every rank's :class:`NoRoom` (the others
    would wait in vain)."""
    layout = trainer.parts.layout
    no_room: list[str | None] = [None]
    if trainer.rank == 0:
        try:
            path = quiet_export(layout.checkpoints, layout.export, prof, settings)
            print(f"exported consolidated weights to {path}", flush=True)
        except NoRoom as err:
            no_room[0] = str(err)
    dist.broadcast_object_list(no_room, src=0)
    if no_room[0] is not None:
        raise NoRoom(no_room[0])


def wait_for_evaluations(evaluations: Evaluations, step: int) -> None:
    """Rank 0 at the end: wait (bounded by ``train.eval_wait_minutes``, one progress line) for the
    evaluations running as jobs, then one line for each still pending and how its results get in."""
    running = evaluations.running()
    if running:
        progress = Progress(enabled=True)
        progress.phase(f"waiting (at most {evaluations.settings.wait_s / 60:g} min, train.eval_wait_minutes)",
                       len(running), "evaluations")
        evaluations.wait(step, progress.update)
        progress.close()
    else:
        evaluations.collect(step)
    for line in evaluations.open_notes():
        print(line, file=sys.stderr if line.startswith("warning:") else sys.stdout, flush=True)


def leave_process_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


@dataclass(frozen=True)
class RunRequest:
    """A start that passed :mod:`pipelines.train_start`'s checks: what the command asked for."""

    out: Path
    profile: Profile
    settings: TrainSettings
    sources: list[CacheSource] | None
    checked: list[CacheSource]  # the training caches and a validation cache, each checked at start
    live_data: Path | None
    data: str | None
    export_at_end: bool
    record_outputs_to: Path | None
    record_samples: int


def run_on_rank(ranks: Ranks, request: RunRequest) -> None:
    """The run on this rank, from joining the process group to the export; a user error ends every
    rank alike with its one line."""
    prof, settings, out = request.profile, request.settings, request.out
    with contextlib.ExitStack() as held:  # released in reverse, on every way out
        held.callback(leave_process_group)
        try:
            quiet_library_warnings()
            # From here a stop signal ends the run after its current step with a checkpoint (exit code 75).
            preemption = Preemption(settings.stop_signals).arm()
            device = init_distributed(prof.device, settings.alloc_conf)
            hold_locks(held, ranks, out, request.checked)
            if (refusal := caches_refusal(ranks, request.checked, request.data, prof)) is not None:
                raise Refused(refusal)
            if ranks.is_main:  # from here: a refused start above leaves no run directory behind
                held.enter_context(ConsoleCopy(RunLayout(out).train_log))
            record_start_on_main(ranks, out, prof, settings, request.checked)
            trainer = Trainer(build_parts(prof, settings, out, device, cache=request.sources,
                                          live_data=request.live_data, data=request.data,
                                          eval_env=environment_outside_ranks()), preemption)
            held.callback(trainer.close)
            resumed = trainer.resume()
            if trainer.rank == 0:
                announce_start(trainer, prof.cache, resumed, ranks.local_world)
            trainer.train()
            trainer.save()
            evaluations = trainer.parts.evaluations  # rank 0 with train.eval_command
            if preemption.stopping:  # every rank alike: the checkpoint is saved, the resume point named
                if evaluations is not None:
                    evaluations.collect(trainer.progress.step)
                stop_preempted(trainer, preemption)
            if evaluations is not None:
                evaluations.launch(trainer.progress.step)
            if request.record_outputs_to is not None:
                record_outputs(trainer, request.record_outputs_to, request.record_samples)
            if request.export_at_end:
                export_on_main(trainer, prof, settings)
            dist.barrier()
            if evaluations is not None:  # the other ranks are done
                wait_for_evaluations(evaluations, trainer.progress.step)
        except USER_ERRORS as err:
            fail_alike(ranks, error_line(err, prof))


@record
def run(ranks: Ranks, request: RunRequest) -> None:
    """:func:`run_on_rank`, with a bug's traceback in torchrun's error file (``record``) and a failed
    rank's exit kept clean."""
    try:
        run_on_rank(ranks, request)
    except SystemExit as stop:
        if isinstance(stop.code, int) and stop.code != 0 and dist.is_available() and dist.is_initialized():
            # A rank ending over a failure with its gloo group up (locks released and files closed on
            # the way here): the interpreter's teardown of a live group can abort ("terminate called
            # without an active exception", exit 134) instead of ending with the run's own code.
            sys.stdout.flush()
            sys.stderr.flush()
            logging.shutdown()
            os._exit(stop.code)
        raise
