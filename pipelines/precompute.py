"""Stage 1 entry point, started on every rank: ``torchrun --nproc_per_node N -m pipelines.precompute``.

Also runs as one plain process (``janus-cache precompute``). Rank 0 indexes the dataset, checks
an existing cache's manifest, plans and writes the tables; then every rank writes the shards it
owns (shard i belongs to rank i mod world), frames first, features second. Shards committed by an
earlier run are checked and skipped, so re-running the same command resumes.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass, replace
from multiprocessing import get_context
from pathlib import Path
from typing import Annotated, Optional

import typer
from torch.distributed.elastic.multiprocessing.errors import record

from janus_cache.dataset import DatasetIndex, build_index
from janus_cache.encoder import WindowEncoder
from janus_cache.plan import Plan, make_plan
from janus_cache.precompute import (
    check_windows,
    committed_count,
    default_workers,
    frame_shape,
    frame_table,
    read_frame_failures,
    sample_table,
    usable_samples,
    wanted_manifest,
    write_feature_shards,
    write_frame_shard,
)
from janus_cache.profile import Profile, load_profile
from janus_cache.resolution import Resolution
from janus_cache.store import CacheWriter, Manifest, open_writer, read_manifest, write_manifest
from janus_cache.store.commit import atomic_write_bytes, read_record, verify_shard
from janus_cache.store.layout import MANIFEST_NAME, REPORT_NAME
from janus_cache.store.layout import frames_array as frames_array_path
from janus_cache.store.manifest import check_compatible, merge_manifests
from pipelines.distributed import Control, Progress, RankFailed, Ranks, die_with_launcher


class PrecomputeError(RuntimeError):
    """A refusal or failure with a one-line reason for the user."""


@dataclass(frozen=True)
class Options:
    data: Path
    out: Path
    profile: str = "tiny"
    cache_format: str = "zarr"
    resolution: Optional[str] = None
    overwrite: bool = False
    force: bool = False
    allow_failures: int = 0
    workers: Optional[int] = None
    strict: bool = False


def _device(profile: Profile, ranks: Ranks) -> str:
    return f"cuda:{ranks.local_rank}" if profile.device == "cuda" else "cpu"


def _own_pending(ranks: Ranks, writer: CacheWriter, array: str, n_shards: int) -> list[int]:
    """This rank's shards that are not committed with a matching checksum (only its own are hashed)."""
    pending = []
    for shard in range(n_shards):
        if not ranks.owns(shard):
            continue
        record = read_record(writer.root, array, shard)
        if record is None or verify_shard(writer.root, record).problem is not None:
            pending.append(shard)
    return pending


def _disk_usage(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def check_free_space(directory: Path, needed_bytes: float, force: bool) -> None:
    """Refuse to start when the filesystem of ``directory`` has less free space than ``needed_bytes``.

    With ``force`` the run starts anyway (with a warning): the plan is an estimate.
    """
    free = shutil.disk_usage(directory).free
    if needed_bytes <= free:
        return
    message = f"{directory} has {free / 1e9:.1f} GB free, the plan needs {needed_bytes / 1e9:.1f} GB more"
    if not force:
        raise PrecomputeError(f"{message}; free space or pass --force")
    print(f"warning: {message}; starting anyway (--force)", file=sys.stderr, flush=True)


def _remove_partials(root: Path) -> None:
    """Delete temporary files of atomic writes that a killed run left behind.

    Shard files are cleaned when their shard is rewritten, but a run killed while writing a
    commit record, the manifest or zarr metadata leaves a stray ``*.partial`` that no shard
    rewrite owns. Rank 0 runs this before any shard writer starts.
    """
    for leftover in root.rglob("*.partial"):
        leftover.unlink(missing_ok=True)


def _prepare(opts: Options, profile: Profile, resolution: Resolution, index: DatasetIndex,
             encoder: WindowEncoder, processes: int, workers: int) -> Manifest:
    """Rank 0: refuse an incompatible cache, plan, and write the frames table and arrays."""
    check_windows(index)
    wanted = wanted_manifest(index, profile.cache, resolution, opts.cache_format, encoder)
    looks_like_cache = (opts.out / "zarr.json").exists() or (opts.out / MANIFEST_NAME).exists()
    if opts.out.exists() and any(opts.out.iterdir()) and not looks_like_cache:
        # Checked before --overwrite: it deletes the directory, which must be an earlier cache.
        raise PrecomputeError(f"{opts.out} exists, is not empty and is not a janus cache; choose another --out")
    if opts.overwrite and opts.out.exists():
        # Before reading anything of the old cache: --overwrite must also work when it is damaged.
        shutil.rmtree(opts.out)
    existing = read_manifest(opts.out) if opts.out.exists() else None
    if existing is not None:
        check_compatible(existing, wanted, source=str(opts.out))

    plan: Plan = make_plan(index, encoder, resolution, profile.cache.vggt_batch)
    print(f"plan for {opts.data} -> {opts.out} ({opts.cache_format}, {resolution.name}):", flush=True)
    print(plan.format(processes, workers), flush=True)
    opts.out.mkdir(parents=True, exist_ok=True)
    check_free_space(opts.out, plan.needed_bytes(opts.cache_format) - _disk_usage(opts.out), opts.force)
    _remove_partials(opts.out)
    writer = open_writer(opts.cache_format, opts.out, wanted.window.name)
    writer.write_table("frames", frame_table(index))
    height, width = frame_shape(index, resolution)
    writer.prepare_frames(resolution.name, (height, width), profile.cache.frames_per_shard)
    manifest = merge_manifests(existing, wanted) if existing is not None else wanted
    write_manifest(opts.out, manifest)
    return manifest


def _finish(opts: Options, writer: CacheWriter, manifest: Manifest, index: DatasetIndex,
            dropped: dict[str, str], frame_failures: dict[int, str], seconds: float) -> int:
    """Rank 0: final manifest, report file and summary; the exit code."""
    existing = read_manifest(opts.out)
    shards = writer.shard_table(verify=False)
    counts = dict(manifest.counts, samples_written=len(index.samples) - len(dropped), samples_failed=len(dropped))
    final = replace(manifest, shards=shards, counts=counts)
    write_manifest(opts.out, merge_manifests(existing, final) if existing is not None else final)
    report = {
        "dataset_problems": [
            {"file": e.file, "reason": str(e.reason), "sample": e.sample_key, "detail": e.detail}
            for e in index.report
        ],
        "failed_frames": {index.frames[row].relpath: reason for row, reason in sorted(frame_failures.items())},
        "failed_samples": dict(sorted(dropped.items())),
    }
    atomic_write_bytes(opts.out / REPORT_NAME, (json.dumps(report, indent=1, sort_keys=True) + "\n").encode())
    written = len(index.samples) - len(dropped)
    print(f"precompute done in {seconds:.1f} s: {written} samples ({written / max(seconds, 1e-9):.2f}/s), "
          f"{len(index.frames)} frames, {_disk_usage(opts.out) / 1e6:.1f} MB in {opts.out}")
    skipped = index.report.counts()
    if skipped:
        print("  skipped while indexing: " + ", ".join(f"{n} {reason}" for reason, n in sorted(skipped.items())))
    if dropped:
        print(f"  {len(dropped)} samples failed (their frames could not be decoded); see {opts.out / REPORT_NAME}")
        for key, reason in list(dropped.items())[:5]:  # dataset order (report.json sorts by key)
            print(f"    {key}: {reason}")
        if len(dropped) > opts.allow_failures:
            print(f"error: {len(dropped)} samples failed, more than --allow-failures {opts.allow_failures}",
                  file=sys.stderr)
            return 1
    return 0


def run(opts: Options) -> int:
    die_with_launcher()
    ranks = Ranks.from_env()
    control = Control(ranks)
    progress = Progress(enabled=ranks.is_main)
    started = time.perf_counter()
    try:
        profile = control.on_main(lambda: load_profile(opts.profile))
        resolution = Resolution.parse(opts.resolution or profile.cache.resolution)
        workers = opts.workers or default_workers(ranks.local_world)
        index: DatasetIndex = control.on_main(
            lambda: build_index(opts.data, history=profile.cache.history, strict=opts.strict, progress=True)
        )
        encoder = WindowEncoder.from_settings(profile.vggt, profile.cache, _device(profile, ranks))
        manifest: Manifest = control.on_main(
            lambda: _prepare(opts, profile, resolution, index, encoder, ranks.world, workers)
        )
        writer = open_writer(opts.cache_format, opts.out, manifest.window.name)

        # Frames phase: decode sources in worker processes, one writer per shard.
        frames_array = frames_array_path(resolution.name)
        n_frame_shards = len(writer.frame_shard_plan(resolution.name))
        mine = _own_pending(ranks, writer, frames_array, n_frame_shards)
        per_shard = profile.cache.frames_per_shard

        def frames_done() -> int:
            return committed_count(opts.out, frames_array) * per_shard

        progress.phase("frames", len(index.frames), "frames", frames_done() if ranks.is_main else 0)
        pool_context = get_context("spawn").Pool(workers) if workers > 1 and mine else nullcontext(None)
        with pool_context as pool:
            for shard in mine:
                write_frame_shard(writer, index, resolution, shard, pool)
                progress.poll(frames_done)
        control.barrier()
        progress.poll(frames_done, force=True)

        # Samples table: every sample whose window frames all decoded (same answer on every rank).
        frame_failures = read_frame_failures(opts.out, resolution.name)
        samples, dropped = usable_samples(index, frame_failures)
        table = sample_table(samples, index.history)
        feature_shape = manifest.resolutions[resolution.name].feature_shape

        def prepare_samples() -> None:
            writer.write_table("samples", table)
            writer.prepare_samples(resolution.name, feature_shape, manifest.feature_dtype,
                                   profile.cache.samples_per_shard)

        control.on_main(prepare_samples)

        # Features phase: windows read back from the stored frames, encoded in batches.
        samples_array = writer.samples_array_path(resolution.name)
        n_sample_shards = len(writer.sample_shard_plan(resolution.name))
        mine = _own_pending(ranks, writer, samples_array, n_sample_shards)
        samples_per_shard = profile.cache.samples_per_shard

        def samples_done() -> int:
            return committed_count(opts.out, samples_array) * samples_per_shard

        progress.phase("features", len(samples), "samples", samples_done() if ranks.is_main else 0)
        write_feature_shards(
            writer, encoder, resolution.name, mine, table["window_rows"], profile.cache.vggt_batch,
            on_done=lambda shard, n: progress.poll(samples_done),
        )
        control.barrier()
        progress.poll(samples_done, force=True)
        progress.close()
        seconds = time.perf_counter() - started
        return control.on_main(
            lambda: _finish(opts, writer, manifest, index, dropped, frame_failures, seconds)
        )
    except RankFailed as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    finally:
        progress.close()
        control.close()


def command(
    data: Annotated[Path, typer.Argument(help="Episode-folder root, or a JSON/JSONL annotation file.")],
    out: Annotated[Path, typer.Option("--out", help="Cache directory (created or resumed).")],
    profile: Annotated[str, typer.Option(help="Profile name or YAML path.")] = "tiny",
    cache_format: Annotated[str, typer.Option("--format", help="zarr (random access) or wds (streaming).")] = "zarr",
    resolution: Annotated[Optional[str], typer.Option(help="e.g. pad644; default: the profile's.")] = None,
    overwrite: Annotated[bool, typer.Option(help="Delete an existing cache at --out and start over.")] = False,
    force: Annotated[bool, typer.Option(help="Start even if the disk has less free space than planned.")] = False,
    allow_failures: Annotated[int, typer.Option(min=0, help="Samples allowed to fail before exit code 1.")] = 0,
    workers: Annotated[Optional[int], typer.Option(min=1, help="Decode processes per rank.")] = None,
    strict: Annotated[bool, typer.Option(help="Fail on any dataset problem instead of skipping.")] = False,
) -> None:
    """Precompute a cache of frozen-VGGT features and uint8 frames (resumable)."""
    if cache_format not in ("zarr", "wds"):
        raise typer.BadParameter(f"--format must be zarr or wds, got {cache_format!r}")
    opts = Options(data, out, profile, cache_format, resolution, overwrite, force, allow_failures, workers, strict)
    raise typer.Exit(run(opts))


@record  # torchrun's failure summary then shows the failing rank's exception
def main() -> None:
    typer.run(command)


if __name__ == "__main__":
    main()
