"""Verify entry point, started on every rank: ``torchrun --nproc_per_node N -m pipelines.verify CACHE``.

Also runs as one plain process (``janus-cache verify``). Rank 0 runs the cheap checks (schema,
completeness, freshness) and plans the rest; the shard checks of ``integrity`` and the samples of
``live`` are split round-robin over the ranks and their findings gathered on every rank, so a
failure anywhere ends every rank alike. Rank 0 prints the table (check -> pass/fail -> detail),
writes the ``--json`` report and decides the exit code: 0 only if no check failed.

With ``--checkpoint DIR`` (a reference JanusVLN checkpoint directory) the frozen encoder and the
fused-embedding function come from that directory instead of the profile: freshness compares the
cache's encoder fingerprint with the directory's ``vggt.aggregator.*`` and the live check
recomputes features and embeddings with it.
"""

from __future__ import annotations

import json
import shlex
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, TypeVar

import torch
import typer
from torch.distributed.elastic.multiprocessing.errors import record

from janus_cache.store import CacheOpenError, load_manifest
from janus_cache.store.formats import DEFAULT_FORMAT
from janus_cache.store.layout import CacheLayout
from janus_cache.store.location import CacheLocation, cache_location, is_remote
from janus_cache.store.remote.errors import RemoteError
from janus_cache.store.split import share
from janus_cache.verify import (
    CHECK_NAMES,
    CHECKSUM_MODES,
    DEFAULT_HASH_THREADS,
    DEFAULT_LIVE_SAMPLES,
    DEFAULT_SEED,
    INTEGRITY,
    LIVE,
    CheckResult,
    ImageEmbeddings,
    LiveChecker,
    LiveSample,
    ShardFinding,
    check_completeness,
    check_freshness,
    check_schema,
    check_targets,
    choose_live_rows,
    crashed,
    dataset_indexes,
    failure_message,
    index_store_of,
    format_table,
    integrity_result,
    live_result,
    plan_integrity,
    profile_encoder,
    report_dict,
    skipped,
)
from janus_core.dtypes import TORCH_DTYPES
from janus_core.index import DatasetIndex
from janus_core.plural import plural
from janus_core.profile import SET_HELP, SET_OPTION, Profile, load_profile
from janus_core.system.device import process_device
from janus_core.vggt.encoder import EncoderIdentity, WindowEncoder
from pipelines.command_line import run as run_command
from pipelines.distributed import Control, Progress, RankFailed, Ranks, fail_alike, job_on_directory
from pipelines.frozen_imports import freeze_imported
from pipelines.precompute_run import frozen_vit
from pipelines.train_start import missing_cache

T = TypeVar("T")


@dataclass(frozen=True)
class Options:
    cache: CacheLocation
    data: Path | None = None
    profile: str = "tiny"
    live: int = DEFAULT_LIVE_SAMPLES
    checksums: str = "all"
    seed: int = DEFAULT_SEED
    json_report: Path | None = None
    """File for the JSON report; ``-`` prints it on stdout (and the table on stderr)."""
    checkpoint: Path | None = None
    """A reference JanusVLN checkpoint directory whose encoder and fused embeddings replace the profile's."""
    threads: int = DEFAULT_HASH_THREADS
    """Threads hashing shards in each process (``--threads``); ranks split the shards between them."""
    overrides: tuple[str, ...] = ()
    """``--set KEY=VALUE`` over the profile's settings."""


@dataclass(frozen=True)
class LiveModels:
    """What one process checks the cache against: the frozen encoder and, from a reference
    checkpoint, the fused-embedding function (None: the live check builds the profile's model)."""

    encoder: WindowEncoder
    embed: ImageEmbeddings | None = None


def load_image_embeddings(profile: Profile, device: torch.device | str) -> tuple[ImageEmbeddings | None, str]:
    """The fused image embeddings (with a DeepStack base, and its DeepStack inputs) of the profile's
    JanusVLN model (cached-feature path) for the live check, or None and why it cannot be built.

    The model lives in the ``janus_train`` package (the ``train`` extra); without it the
    embeddings part of the live check is reported as not run.
    """
    try:
        from janus_train.model.janus_model import JanusVLNModel
    except ImportError as err:
        return None, f"janus_train.model.janus_model is not importable ({err}); install the train extra"
    model = JanusVLNModel.from_profile(profile, live=False, device=device)
    return model.eval().visual_embeddings, ""


def load_reference_models(directory: Path, profile: Profile, device: torch.device) -> LiveModels:
    """The encoder (``vggt.aggregator.*``) and fused embeddings (vision tower, merger, ``lam``) of a
    reference JanusVLN checkpoint directory; a directory that does not fit is a one-line ValueError."""
    try:
        from janus_train.checkpoint.reference import reference_live_check
        from janus_train.model.janus_model import aggregator_config
    except ImportError as err:
        raise ValueError(f"--checkpoint needs janus_train ({err}); install the train extra") from err
    encoder, fusion = reference_live_check(directory, profile.cache, aggregator_config(profile.vggt), device,
                                           TORCH_DTYPES[profile.compute_dtype])
    return LiveModels(encoder, fusion.image_embeddings)


def ignored_heads(directory: Path) -> str:
    """What of a reference checkpoint directory is read past: the VGGT depth and point heads the
    reference keeps unused in every checkpoint ('' when it holds none)."""
    from janus_train.checkpoint.reference import unused_heads

    count = len(unused_heads(directory))
    return f" (its {count} unused VGGT depth/point head tensors ignored)" if count else ""


def gather(control: Control, fn: Callable[[], T]) -> list[T]:
    """Run ``fn`` on every rank and give every rank all results (rank order); any rank's failure
    fails every rank alike, with that rank's reason (once, unnamed, when every rank gives the same
    one, as for bad input such as a damaged checkpoint)."""
    return control.gather(fn)


def everywhere(control: Control, fn: Callable[[], T]) -> T:
    """Run ``fn`` on every rank and keep each rank's own result; a failure on any rank fails every
    rank alike (only the outcome is exchanged, not the result)."""
    result: list[T] = []
    gather(control, lambda: result.append(fn()))
    return result[0]


def _integrity(opts: Options, ranks: Ranks, control: Control, progress: Progress) -> CheckResult:
    started = time.perf_counter()
    plan = control.on_main(lambda: plan_integrity(opts.cache, opts.checksums, opts.seed))
    mine = share(plan.targets, ranks.rank, ranks.world)
    # Shown in bytes read (rate in MB/s or GB/s, ETA) when anything is hashed, else in shards.
    to_read = sum(t.nbytes for t in mine)
    name = f"{INTEGRITY} (rank 0 of {ranks.world})" if ranks.world > 1 else INTEGRITY
    if to_read:
        progress.phase(name, to_read, "B")
    else:
        progress.phase(name, len(mine), "shards")
    done = [0]

    def advance(finding: ShardFinding) -> None:
        done[0] += finding.target.nbytes if to_read else 1
        progress.update(done[0])

    parts = gather(control, lambda: check_targets(opts.cache, mine, advance, opts.threads))
    findings: list[ShardFinding] = [f for part in parts for f in part]
    progress.close()
    return control.on_main(lambda: integrity_result(opts.cache, plan, findings, time.perf_counter() - started))


def _live(opts: Options, ranks: Ranks, control: Control, progress: Progress, profile: Profile,
          index: DatasetIndex, models: LiveModels) -> CheckResult:
    started = time.perf_counter()
    device = process_device(profile.device, ranks.local_rank)
    rows = control.on_main(lambda: choose_live_rows(opts.cache, opts.live, opts.seed))
    mine = share(rows, ranks.rank, ranks.world)
    progress.phase(f"{LIVE} (rank 0 of {ranks.world})" if ranks.world > 1 else LIVE, len(mine), "samples")

    def my_part() -> tuple[list[LiveSample], str, str | None]:
        if models.embed is not None:
            embed, note = models.embed, ""
        else:
            embed, note = load_image_embeddings(profile, device) if mine else (None, "")
        # The frozen ViT (cache.vit_features) with the model's attention kernels, as precompute ran it.
        vit = frozen_vit(profile, str(device)) if mine else None
        checker = LiveChecker(opts.cache, profile, index, device, models.encoder, embed, note, vit)
        unavailable = checker.unavailable()
        return ([] if unavailable else checker.measure(mine, progress.update)), note, unavailable

    parts = gather(control, my_part)
    progress.close()
    samples: list[LiveSample] = sorted((s for part, _, _ in parts for s in part), key=lambda s: s.row)
    notes = [n for _, n, _ in parts if n]
    unavailable = parts[0][2]
    return control.on_main(lambda: live_result(samples, profile, device, opts.seed, time.perf_counter() - started,
                                                notes[0] if notes else "", unavailable))


def _guard(name: str, check: Callable[[], CheckResult]) -> CheckResult:
    """A split check whose reading failed on some rank fails (on every rank alike, as gather and
    on_main raise on all of them) instead of ending the run: damaged data is a finding."""
    started = time.perf_counter()
    try:
        return check()
    except RankFailed as err:
        return crashed(name, err, time.perf_counter() - started)


def _plus(result: CheckResult, seconds: float) -> CheckResult:
    result.seconds += seconds
    return result


def run_checks(opts: Options, ranks: Ranks, control: Control, progress: Progress) -> list[CheckResult]:
    """Every check, on every rank (rank 0's list is the one that counts)."""
    if opts.checksums not in CHECKSUM_MODES:
        raise ValueError(f"--checksums must be one of {', '.join(CHECKSUM_MODES)}, got {opts.checksums!r}")
    results: list[CheckResult] = [control.on_main(lambda: check_schema(opts.cache))]

    def cache_history() -> int | str:
        try:
            return load_manifest(opts.cache).window.history
        except CacheOpenError as err:
            return str(err)

    history = control.on_main(cache_history)
    if isinstance(history, str):
        return results + [skipped(name, "not run: the cache cannot be opened") for name in CHECK_NAMES[1:]]
    profile: Profile = control.on_main(lambda: load_profile(opts.profile, opts.overrides))
    # Indexing the dataset (hashing every source file) is part of completeness's time, building
    # the encoder (whose weights are hashed) part of freshness's.
    started = time.perf_counter()
    indexes: tuple[DatasetIndex | None, DatasetIndex | None] = (None, None)
    live_wanted = opts.data is not None and opts.live > 0
    if opts.data is not None:
        # Reused from the cache's index store while the dataset's files are unchanged. Completeness
        # runs on rank 0 alone; only the live check (windows on every rank) needs the index sent to
        # the other ranks (a stored index goes as where it is stored: each rank reads it lazily).
        built: list[tuple[DatasetIndex, DatasetIndex]] = []

        def build() -> tuple[DatasetIndex, DatasetIndex] | None:
            built.append(dataset_indexes(opts.data, history, profile.cache.history,
                                         profile.cache.subinstruction_rule, index_store_of(opts.cache),
                                         load_manifest(opts.cache).dataset.sources, live=live_wanted))
            return built[0] if live_wanted else None

        indexes = control.on_main(build) or (built[0] if built else (None, None))
    index_seconds = time.perf_counter() - started
    # Every rank of the live check builds the encoder; freshness hashes its weights (rank 0), from
    # the built encoder when there is one, else from the checkpoint file without building it. A
    # reference checkpoint's encoder is always built: its identity is that of the loaded module.
    started = time.perf_counter()
    device = process_device(profile.device, ranks.local_rank)

    def build() -> LiveModels:
        if opts.checkpoint is not None:
            return load_reference_models(opts.checkpoint, profile, device)
        return LiveModels(WindowEncoder.from_settings(profile.vggt, profile.cache, device))

    models: LiveModels | None = None
    if live_wanted:
        models = everywhere(control, build)
        identity = control.on_main(lambda: EncoderIdentity.of(models.encoder.model))
    elif opts.checkpoint is not None:
        identity = control.on_main(lambda: EncoderIdentity.of(build().encoder.model))
    else:
        identity = control.on_main(lambda: profile_encoder(profile))
    encoder_seconds = time.perf_counter() - started

    results.append(_guard(INTEGRITY, lambda: _integrity(opts, ranks, control, progress)))
    results.append(_plus(control.on_main(lambda: check_completeness(opts.cache, indexes[0])), index_seconds))
    freshness = _plus(control.on_main(lambda: check_freshness(opts.cache, profile, identity)), encoder_seconds)
    if opts.checkpoint is not None:
        freshness.detail += f"; encoder of checkpoint {opts.checkpoint}" + ignored_heads(opts.checkpoint)
        freshness.data["encoder_source"] = str(opts.checkpoint)
    results.append(freshness)
    if opts.data is None:
        results.append(skipped(LIVE, "not run: needs --data (the live path decodes the dataset's source images)"))
    elif opts.live <= 0:
        results.append(skipped(LIVE, "not run: --live 0"))
    else:
        assert models is not None
        live = _guard(LIVE, lambda: _live(opts, ranks, control, progress, profile, indexes[1], models))
        if opts.checkpoint is not None:
            live.detail += f"; encoder and embeddings of checkpoint {opts.checkpoint}"
            live.data["checkpoint"] = str(opts.checkpoint)
        results.append(live)
    return results


def repair_command(opts: Options, results: list[CheckResult], cache_format: str | None) -> str | None:
    """The precompute command that repairs the damaged shards the integrity check found (None when
    it found none, or the cache is in a bucket): the same cache, dataset (``DATA`` when verify was not given ``--data``), profile
    and overrides, and ``--checksums all`` where some damage shows only to hashing."""
    integrity = next((r for r in results if r.name == INTEGRITY and r.failed), None)
    if integrity is None or is_remote(opts.cache):  # a bucket's cache is read-only: no precompute writes it
        return None
    words = ["janus-cache", "precompute", shlex.quote(str(opts.data)) if opts.data is not None else "DATA",
             "--out", shlex.quote(str(opts.cache)), "--profile", shlex.quote(opts.profile)]
    words += [word for setting in opts.overrides for word in (SET_OPTION, shlex.quote(setting))]
    if cache_format is not None and cache_format != DEFAULT_FORMAT:
        words += ["--format", cache_format]
    if any(bad.get("hash_only") for bad in integrity.data.get("bad", [])):
        words += ["--checksums", "all"]
    where = "" if opts.data is not None else " (DATA: the dataset the cache was built from)"
    return " ".join(words) + where


def _emit(opts: Options, results: list[CheckResult], world: int, seconds: float) -> int:
    """Rank 0: print the table, write the report; the exit code."""
    report = report_dict(opts.cache, results, data=opts.data, profile=opts.profile, live=opts.live,
                         checksums=opts.checksums, seed=opts.seed, world_size=world, seconds=seconds)
    to_stdout = opts.json_report is not None and str(opts.json_report) == "-"
    table_stream = sys.stderr if to_stdout else sys.stdout
    where = f"{opts.cache} ({report['format'] or 'format unknown'}, profile {opts.profile}, " + (
        f"data {opts.data}" if opts.data else "no --data") + (
        f", checkpoint {opts.checkpoint}" if opts.checkpoint else "") + f", {plural(world, 'process')})"
    print(f"janus-cache verify {where}", file=table_stream)
    print(format_table(results), file=table_stream, flush=True)
    text = json.dumps(report, indent=2, sort_keys=True, default=str) + "\n"
    if to_stdout:
        sys.stdout.write(text)
    elif opts.json_report is not None:
        opts.json_report.parent.mkdir(parents=True, exist_ok=True)
        opts.json_report.write_text(text)
    message = failure_message(opts.cache, results)
    if message:
        repair = repair_command(opts, results, report["format"])
        print(f"error: {message}" + (f"; repair it with: {repair}" if repair else ""), file=sys.stderr, flush=True)
        return 1
    ran = [r.name for r in results if not r.skipped]
    note = "; skipped: " + ", ".join(r.name for r in results if r.skipped) if len(ran) < len(results) else ""
    print(f"verify passed: {', '.join(ran)}{note} ({seconds:.1f} s)", file=table_stream, flush=True)
    return 0


def run(opts: Options) -> int:
    ranks = Ranks.from_env()
    started = time.perf_counter()
    try:
        # A reader's lock: no precompute writes (or deletes) the cache while it is checked. A
        # cache this process cannot write to (read-only) is checked without one.
        with job_on_directory(ranks, opts.cache, exclusive=False) as (control, progress):
            results = run_checks(opts, ranks, control, progress)
            return control.on_main(lambda: _emit(opts, results, ranks.world, time.perf_counter() - started))
    except (RankFailed, ValueError, RemoteError) as err:
        if ranks.is_main:  # every rank fails alike; one of them says why
            print(f"error: {err}", file=sys.stderr)
        return 1


def command(
    cache: Annotated[str, typer.Argument(help="Cache directory, or s3://BUCKET/PREFIX (read in place), to verify.")],
    data: Annotated[Path | None, typer.Option(
        help="The dataset the cache was built from (episode-folder root or annotation file); "
             "needed to compare against the dataset and for the live check.")] = None,
    profile: Annotated[str, typer.Option(
        help="Profile (name or YAML path) whose settings and models the cache must match.")] = "tiny",
    overrides: Annotated[list[str] | None, typer.Option(SET_OPTION, help=SET_HELP)] = None,
    live: Annotated[int, typer.Option(
        min=0, help="Samples to recompute from the sources (0: none).")] = DEFAULT_LIVE_SAMPLES,
    checksums: Annotated[str, typer.Option(
        help="Shards to hash: all, sample (1 in 16 of each array, chosen by --seed, and every table) or none "
             "(commit record, file and size only).")] = "all",
    threads: Annotated[int, typer.Option(min=1, help="Threads hashing shards in each process.")] = DEFAULT_HASH_THREADS,
    seed: Annotated[int, typer.Option(help="Seed choosing the live samples and sampled checksums.")] = DEFAULT_SEED,
    json_report: Annotated[Path | None, typer.Option(
        "--json", help="Write the report as JSON to this file ('-': stdout, the table then goes to stderr).")] = None,
    checkpoint: Annotated[Path | None, typer.Option(
        help="A reference JanusVLN checkpoint directory: its VGGT (vggt.aggregator.*) is the encoder freshness "
             "and the live check compare with, its vision tower, merger and lam make the fused embeddings.")] = None,
) -> None:
    """Check that a cache is complete, intact and current.

    Schema, integrity (checksums), completeness and freshness against the dataset and profile, and
    samples recomputed live (--live); exit 1 if any check fails."""
    if checksums not in CHECKSUM_MODES:
        raise typer.BadParameter(f"--checksums must be one of {', '.join(CHECKSUM_MODES)}, got {checksums!r}")
    location = cache_location(cache)
    if (missing := missing_cache(location)) is not None:  # a cache not made yet: no table of skipped checks
        fail_alike(Ranks.from_env(), missing)
    freeze_imported()  # this module imported torch as it loaded (pipelines.frozen_imports)
    raise typer.Exit(run(Options(location, data, profile, live, checksums, seed, json_report, checkpoint,
                                 threads, tuple(overrides or ()))))


@record  # torchrun's failure summary then shows the failing rank's exception
def main() -> None:
    run_command(command)


if __name__ == "__main__":
    main()
