"""The run half of stage 1's entry point (:mod:`pipelines.precompute`, which checks the command line
first): a precompute on every rank of a launch, or in one plain process. The cache's contract is the
library's :class:`~janus_cache.job.PrecomputeJob`; this module only decides who runs
which step: rank 0 indexes the dataset and prepares the cache, every rank writes the shards it
owns (shard i belongs to rank i mod world), frames first, then (``cache.vit_features``) the
frozen ViT's output per frame, features last, with barriers in between, and rank 0 finishes.
Shards committed by an earlier run are skipped, so re-running the same command resumes.

The dataset index is kept in the cache (``CacheLayout.index_store``): rank 0's index worker
(:mod:`pipelines.index_worker`) reuses it while the dataset's files are unchanged, else rebuilds
it (new or changed images checked by worker processes on all of the node's cores) and stores it;
every rank then reads the stored columns lazily, making rows only when they are read, and the
job's index-wide steps work on whole columns (no rank holds the index as Python objects).
"""

from __future__ import annotations

import resource
import sys
import time
from collections.abc import Callable, Iterable
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from torch.distributed.elastic.multiprocessing.errors import record

from janus_cache.job import (
    PrecomputeError,
    PrecomputeJob,
    Prepared,
    refuse_foreign_directory,
)
from janus_cache.plan import Plan
from janus_cache.store.commit import is_committed
from janus_cache.store.formats import DEFAULT_FORMAT
from janus_cache.store.layout import REPORT_NAME, CacheLayout
from janus_cache.store.manifest import read_manifest
from janus_cache.store.split import shards_for
from janus_core.bases import cache_base
from janus_core.index import DatasetIndex, ImageRoots, StoredSources
from janus_core.plural import plural
from janus_core.profile import CacheSettings, Profile, load_profile
from janus_core.qwen_vit import ViTEncoder
from janus_core.resolution import Resolution
from janus_core.system.device import process_device
from janus_core.system.lock import LockError
from janus_core.system.threads import default_decode_workers, set_compute_threads
from janus_core.vggt.encoder import WindowEncoder
from pipelines.distributed import CommitTally, Control, RankFailed, Ranks, job_on_directory
from pipelines.index_worker import store_index_in_worker
from pipelines.parent_death import spawn_pool


@dataclass(frozen=True)
class Options:
    data: tuple[str | Path, ...] | str | Path
    """Dataset sources: paths or ``NAME=PATH`` (``janus_core.index.sources``), in cache order; one
    path or string is one value (a string may list several sources separated by spaces)."""
    out: Path
    profile: str = "tiny"
    cache_format: str = DEFAULT_FORMAT
    resolution: Resolution | str | None = None  # a name is parsed by run()
    overwrite: bool = False
    force: bool = False
    allow_failures: int = 0
    workers: Optional[int] = None
    strict: bool = False
    image_root: ImageRoots = None
    """The annotation files' image roots: ``NAME=DIR`` each, or one bare ``DIR`` for a single source."""
    checksums: str = "none"
    """Committed shards a resume hashes before trusting them: ``none`` (commit record and byte
    size only: no shard payload is read), ``sample`` (one in 16 and every table) or ``all``."""
    overrides: tuple[str, ...] = ()
    """``--set KEY=VALUE`` over the profile's settings."""

    def __post_init__(self) -> None:
        if isinstance(self.data, (str, Path)):
            object.__setattr__(self, "data", (self.data,))

    @property
    def sources(self) -> str:
        """The sources as given, for messages."""
        return " ".join(str(d) for d in self.data)


def _device(profile: Profile, ranks: Ranks) -> str:
    return str(process_device(profile.device, ranks.local_rank))


def frozen_vit(profile: Profile, device: str) -> ViTEncoder | None:
    """The profile's frozen Qwen ViT (``cache.vit_features``) with the attention kernels the model's
    live path runs (:mod:`janus_train.model.vision_attention`), or None when the profile caches no ViT output."""
    if not profile.cache.vit_features:
        return None
    from janus_train.model.janus_model import attention_implementation  # transformers: only for profiles that need it
    from janus_train.model.vision_attention import vision_attention

    vit = ViTEncoder.from_profile(profile, device, attention_implementation(device))
    config = vit.visual.config
    config._attn_implementation = vision_attention(config._attn_implementation)
    return vit


def default_workers(local_processes: int) -> int:
    """Decode workers per process: the machine's cores shared by the processes on it."""
    return default_decode_workers(local_processes)


def _prepare(job: PrecomputeJob, opts: Options, profile: Profile, resolution: Resolution, processes: int,
             workers: int) -> Prepared:
    """Rank 0: the job's first step, printing its plan as soon as it is measured."""

    def show(plan: Plan) -> None:
        print(f"plan for {opts.sources} -> {opts.out} ({opts.cache_format}, {resolution.name}, profile {profile.name}):",
              flush=True)
        print(plan.format(processes, workers), flush=True)
        # What the index skips, as `janus-cache index` and `plan` say it.
        print("\n".join(job.index.report.summary_lines(f"{opts.out / REPORT_NAME} (when the run ends)")), flush=True)

    prepared = job.prepare(overwrite=opts.overwrite, force=opts.force, on_plan=show, done_check=opts.checksums)
    for warning in prepared.warnings:
        print(f"warning: {warning}", file=sys.stderr, flush=True)
    for note in prepared.notes:
        print(note, flush=True)
    return prepared


def recorded_source_names(out: Path) -> tuple[str, ...]:
    """The source names in the manifest of the cache at ``out``; none for a new cache, or one whose
    manifest cannot be read (the job's prepare step reports that)."""
    try:
        manifest = read_manifest(out)
    except Exception:  # noqa: BLE001 - a damaged manifest is prepare()'s to report or repair
        return ()
    return manifest.dataset.sources if manifest is not None else ()


def index_on_every_rank(opts: Options, cache: CacheSettings, control: Control) -> DatasetIndex:
    """The dataset index of every source, on every rank, read lazily from the cache's index store:
    rank 0's index worker (:mod:`pipelines.index_worker`) brings the stored index up to date (reused
    while the sources keep their sizes and mtimes, else rebuilt with all local cores reading only
    new or changed images), then every rank maps its columns and makes only the rows it uses."""

    def on_main() -> StoredSources:
        refuse_foreign_directory(opts.out)  # nothing is written there, not even the index
        # A bare path takes the name the cache gave it: a moved dataset resumes (or appends) as itself.
        recorded = () if opts.overwrite else recorded_source_names(opts.out)
        return store_index_in_worker(
            opts.data, CacheLayout(opts.out).index_store, history=cache.history, image_root=opts.image_root,
            strict=opts.strict, subinstruction_rule=cache.subinstruction_rule, processes=default_workers(1),
            recorded_names=recorded)

    stored = control.on_main(on_main)
    mine: list[DatasetIndex] = []  # each rank's own reading (a failure on one fails all alike)
    control.gather(lambda: mine.append(stored.load()))
    return mine[0]


def peak_memory() -> tuple[float, float]:
    """(this process's, its largest finished child's) peak resident memory in MB."""
    return (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024)


def format_peaks(peaks: list[tuple[float, float]]) -> str:
    """The summary line sizing a node: each rank's peak memory and its workers' (index, decode)."""
    ranks = ", ".join(f"{own:.0f}" for own, _ in peaks)
    return f"  peak memory: rank{'s' if len(peaks) > 1 else ''} {ranks} MB; workers up to {max(w for _, w in peaks):.0f} MB"


def _complete(opts: Options, prepared: Prepared, resolution: Resolution) -> int:
    """Rank 0: the cache already holds this run's work: say so in one line; the exit code."""
    counts = prepared.manifest.counts
    failed = counts.get("samples_failed", 0)
    # Samples left out by an earlier run stay left out: the line says so, as that run's summary did.
    left_out = (f", {plural(failed, 'sample')} failed (their frames could not be decoded; see {opts.out / REPORT_NAME})"
                if failed else "")
    # What the check read: a resume trusts commit record and size unless --checksums hashed shards.
    checked = {"all": "every shard committed and hashed (--checksums all: each matches its commit record)",
               "sample": "every shard committed, 1 in 16 and every table hashed (--checksums sample)"}
    how = {"all": "nothing to repair (--overwrite rebuilds it)",
           "sample": "nothing to repair (janus-cache verify hashes the rest, --overwrite rebuilds it)"}
    print(f"cache {opts.out} is complete: {plural(counts.get('samples_written', counts['samples']), 'sample')} at "
          f"{resolution.name} ({opts.cache_format}), {checked.get(opts.checksums, 'every shard committed')}"
          f"{left_out}; {how.get(opts.checksums, 'nothing to do (janus-cache verify checks its contents, --overwrite rebuilds it)')}",
          flush=True)
    if failed > opts.allow_failures:
        print(f"error: {plural(failed, 'sample')} failed, more than --allow-failures {opts.allow_failures}; see "
              f"{opts.out / REPORT_NAME}", file=sys.stderr)
        return 1
    return 0


def _finish(job: PrecomputeJob, opts: Options, seconds: float, peaks: list[tuple[float, float]],
            computed: int) -> int:
    """Rank 0: the job's last step and its summary (``computed``: the samples this run encoded); the
    exit code."""
    outcome = job.finish()
    print(outcome.format(seconds, computed), flush=True)
    print(format_peaks(peaks), flush=True)
    if len(outcome.dropped) > opts.allow_failures:
        print(f"error: {plural(len(outcome.dropped), 'sample')} failed, more than --allow-failures {opts.allow_failures}",
              file=sys.stderr)
        return 1
    return 0


def run(opts: Options) -> int:
    ranks = Ranks.from_env()
    started = time.perf_counter()
    try:
        # One writer per cache, for the whole run: taken before anything is read or deleted.
        with job_on_directory(ranks, opts.out) as (control, progress):
            profile = control.on_main(lambda: load_profile(opts.profile, opts.overrides))
            base = control.on_main(lambda: cache_base(profile.qwen.path))
            resolution = Resolution.parse(opts.resolution or profile.cache.resolution)
            workers = opts.workers or default_workers(ranks.local_world)
            # Before any model is built: torch's threads sized from this process's share of the node's cores.
            set_compute_threads(ranks.local_world)
            index = index_on_every_rank(opts, profile.cache, control)
            encoder = WindowEncoder.from_settings(profile.vggt, profile.cache, _device(profile, ranks))
            # Built on every rank inside an exchange: a Qwen directory without a loadable ViT is one line.
            vits: list[ViTEncoder | None] = []
            control.gather(lambda: vits.append(frozen_vit(profile, _device(profile, ranks))), (ValueError,))
            job = PrecomputeJob(index, opts.out, opts.cache_format, profile.cache, resolution, encoder, vits[0], base)
            prepared = control.on_main(lambda: _prepare(job, opts, profile, resolution, ranks.world, workers))
            if prepared.complete:  # nothing measured, nothing written
                return control.on_main(lambda: _complete(opts, prepared, resolution))
            job.planned_bytes = prepared.plan.needed_bytes(opts.cache_format)
            # Every rank's shard work ends in an exchange instead of a barrier: a rank that fails (a
            # full disk, a bad file) makes every rank stop with its one-line reason, none waits for it.
            user_errors = (ValueError, PrecomputeError, LockError)

            def phase(what: str, pending_of: Callable[[Iterable[int], str], list[int]], shards: int, array: str,
                      shard_rows: list[int], total: int, unit: str) -> tuple[list[int], CommitTally]:
                """A phase's start: this rank's pending shards (of the ones it owns), and the tally of
                every rank's that rank 0's progress display counts."""
                pending = control.gather(lambda: pending_of(shards_for(shards, ranks.rank, ranks.world),
                                                            opts.checksums), user_errors)
                tally = CommitTally(lambda shard: is_committed(opts.out, array, shard), shard_rows, pending)
                progress.phase(what, total, unit, tally.done)
                return pending[ranks.rank], tally

            # Frames phase: decode sources in worker processes, one writer per shard.
            mine, tally = phase("frames", job.pending_frame_shards, job.n_frame_shards, job.frames_array,
                                job.frame_shard_rows, job.n_frames, "frames")

            def frames() -> None:
                with spawn_pool(workers) if workers > 1 and mine else nullcontext(None) as pool:
                    for shard in mine:
                        job.frame_shard(shard, pool)
                        progress.poll(tally)

            control.gather(frames, user_errors)
            progress.poll(tally, force=True)

            # ViT phase (cache.vit_features): the frozen ViT's output of every stored frame, once per frame.
            if job.vit is not None:
                mine, tally = phase("ViT features", job.pending_vit_shards, job.n_vit_shards, job.vit_array,
                                    job.frame_shard_rows, job.n_frames, "frames")

                def vit_shards() -> None:
                    for shard in mine:
                        job.vit_shard(shard)
                        progress.poll(tally)

                control.gather(vit_shards, user_errors)
                progress.poll(tally, force=True)

            # Features phase: windows read back from the stored frames, encoded in batches.
            control.on_main(job.prepare_features)
            mine, tally = phase("features", job.pending_feature_shards, job.n_feature_shards, job.samples_array,
                                job.feature_shard_rows, len(job.usable_rows), "samples")
            computed = len(job.usable_rows) - tally.done  # committed before this run: not this run's work
            control.gather(lambda: job.feature_shards(mine, on_done=lambda shard, n: progress.poll(tally)), user_errors)
            progress.poll(tally, force=True)
            progress.close()
            seconds = time.perf_counter() - started
            peaks = control.gather(peak_memory)
            return control.on_main(lambda: _finish(job, opts, seconds, peaks, computed))
    except RankFailed as err:
        if ranks.is_main:  # every rank failed alike: one line for the user
            print(f"error: {err}", file=sys.stderr)
        return 1


@record  # torchrun's failure summary then shows the failing rank's exception
def launched(opts: Options) -> int:
    """:func:`run` as a rank of a launch runs it (the entry point's, after its checks)."""
    return run(opts)
