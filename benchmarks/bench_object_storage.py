"""The training reader from local disk against the same cache in a bucket of an S3 server on this
machine (SeaweedFS, :mod:`benchmarks.seaweedfs`): samples/s, and for the bucket the GET requests
and body bytes per sample, with zarr's own reads (a shard's index fetched again for every read, then
each chunk alone) and with janus's (the index kept per process, a run of chunks fetched at once:
:mod:`janus_cache.store.remote.zarr_store`).

The cache is the data-path section's (9 frames at pad644 per sample, tiny-VGGT features), pushed
with ``janus-cache push``'s engine. A loopback server has no network latency to hide, so its
samples/s bound what the reader's own work costs; the request counts are what a remote bucket
charges and waits for per sample. ``make bench`` runs it as its section 6; ``python -m
benchmarks.bench_object_storage`` runs it alone (writing ``object_storage.json``).
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import shutil
from collections.abc import Iterator
from dataclasses import asdict
from datetime import date
from pathlib import Path
from typing import Annotated, Any

import torch
import typer

from benchmarks.data_path import bench_profile
from benchmarks.measure import RESULTS_DIR, rates
from benchmarks.seaweedfs import BUCKET, seaweedfs
from janus_cache.keys import window_variant
from janus_cache.store import open_cache
from janus_cache.store.remote import zarr_store
from janus_cache.store.remote.path import S3Path
from janus_cache.transfer import push
from janus_core.profile import load_profile
from janus_train.data.workers import worker_start


@contextlib.contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    saved = dict(os.environ)
    os.environ.update(values)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


class _Rows(torch.utils.data.Dataset):
    """Each row read through ``reader`` (a DataLoader's workers read in parallel)."""

    def __init__(self, reader: Any) -> None:
        self.reader = reader

    def __len__(self) -> int:
        return len(self.reader)

    def __getitem__(self, row: int) -> int:
        self.reader.sample(row)
        return row


def reader_from_bucket(work: Path, cache: Path, profile_path: Path, repeats: int, workers: int) -> dict[str, Any]:
    """Samples/s of the zarr reader on ``cache`` from disk and from the bucket; GETs and bytes per sample."""
    profile = load_profile(profile_path)
    resolution, variant = profile.cache.resolution.name, window_variant(profile.cache).name
    local = open_cache(cache, resolution=resolution, variant=variant).reader
    n = len(local)

    def all_rows(reader: Any) -> Any:
        def run() -> int:
            for row in range(n):
                reader.sample(row)
            return n
        return run

    def with_workers(reader: Any) -> Any:
        def run() -> int:
            loader = torch.utils.data.DataLoader(_Rows(reader), batch_size=None, num_workers=workers,
                                                 **worker_start(workers))
            return sum(1 for _ in loader)
        return run

    with seaweedfs(work / "seaweedfs") as server, _environment(server.env()):
        url = S3Path(BUCKET, "bench/cache644")
        push(cache, url)
        remote = open_cache(url, resolution=resolution, variant=variant).reader

        def counted(janus: bool) -> tuple[dict[str, Any], float, float]:
            """samples/s (one pass warms up), GETs and bytes per sample of the last pass; zarr's own
            reads, or janus's (indexes kept, runs read ahead)."""
            zarr_store.INDEX_CACHE_BYTES, zarr_store.READ_AHEAD = (kept, True) if janus else (0, False)
            try:
                rate = rates(all_rows(remote), repeats)
                before = zarr_store.REQUESTS.gets, zarr_store.REQUESTS.bytes
                all_rows(remote)()
                gets, received = zarr_store.REQUESTS.gets - before[0], zarr_store.REQUESTS.bytes - before[1]
            finally:
                zarr_store.INDEX_CACHE_BYTES, zarr_store.READ_AHEAD = kept, True
            return asdict(rate), gets / n, received / n

        kept = zarr_store.INDEX_CACHE_BYTES
        uncached, gets_uncached, bytes_uncached = counted(janus=False)
        cached, gets_cached, bytes_cached = counted(janus=True)
        local_rate = rates(all_rows(local), repeats)
        remote_workers = rates(with_workers(remote), max(1, repeats // 2))
        local_workers = rates(with_workers(local), max(1, repeats // 2))
    return {
        "samples": n,
        "resolution": resolution,
        "frames_per_sample": profile.cache.history + 1,
        "server": "SeaweedFS weed mini on 127.0.0.1 (loopback, no network latency)",
        "local_per_core": asdict(local_rate),
        "bucket_per_core_zarr_reads": uncached,
        "bucket_per_core": cached,
        "gets_per_sample_zarr_reads": gets_uncached,
        "gets_per_sample": gets_cached,
        "bytes_per_sample_zarr_reads": bytes_uncached,
        "bytes_per_sample": bytes_cached,
        "loader_workers": workers,
        "local_with_workers": asdict(local_workers),
        "bucket_with_workers": asdict(remote_workers),
    }


def markdown_rows(r: dict[str, Any]) -> list[str]:
    """The section's rows of the results table."""
    def st(x: dict[str, float]) -> str:
        return f"{x['median']:.3g} ({x['min']:.3g}–{x['max']:.3g})"

    return [
        f"| training reader from disk vs a bucket ({r['server']}), samples/s per core, {r['frames_per_sample']}×"
        f"{r['resolution']} frames | {st(r['local_per_core'])} | {st(r['bucket_per_core'])} | "
        f"{r['bucket_per_core']['median'] / r['local_per_core']['median']:.2f}× |",
        f"| the same with {r['loader_workers']} loader workers | {st(r['local_with_workers'])} | "
        f"{st(r['bucket_with_workers'])} | {r['bucket_with_workers']['median'] / r['local_with_workers']['median']:.2f}× |",
        f"| bucket, samples/s per core: zarr's own reads / janus's | {st(r['bucket_per_core_zarr_reads'])} | "
        f"{st(r['bucket_per_core'])} | |",
        f"| GETs per sample from the bucket: zarr's own reads (index fetched for every read, then each chunk) "
        f"/ janus's (index kept, a run of chunks at once) | {r['gets_per_sample_zarr_reads']:.1f} | "
        f"{r['gets_per_sample']:.1f} | {r['gets_per_sample_zarr_reads'] / r['gets_per_sample']:.2f}× |",
        f"| bytes per sample from the bucket (zarr's / janus's reads) | "
        f"{r['bytes_per_sample_zarr_reads'] / 1e3:.0f} kB | {r['bytes_per_sample'] / 1e3:.0f} kB | |",
    ]


def command(
    out: Annotated[Path, typer.Option(help="Where object_storage.json goes.")] = RESULTS_DIR,
    repeats: Annotated[int, typer.Option(min=1, help="Repeats per measurement.")] = 5,
    workers: Annotated[int, typer.Option(min=1, help="Loader workers.")] = 2,
) -> None:
    """This section of ``make bench`` alone, on the same pad644 cache (its precompute included)."""
    from janus_core.sample_data import write_sample_data
    from pipelines.precompute_run import Options
    from pipelines.precompute_run import run as run_precompute

    work = out / "work-object-storage"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    try:
        write_sample_data(work / "data644", episodes=1, steps=8, seed=1)
        profile_path = bench_profile(work, "pad644", samples_per_shard=4, frames_per_shard=8, vggt_batch=1)
        if run_precompute(Options(work / "data644", work / "cache644", str(profile_path), workers=1)) != 0:
            raise RuntimeError("precompute of the pad644 benchmark cache failed")
        results = {"date": date.today().isoformat(), "machine": f"{platform.machine()}, {os.cpu_count()} cores",
                   **reader_from_bucket(work, work / "cache644", profile_path, repeats, workers)}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    (out / "object_storage.json").write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    print("\n".join(markdown_rows(results)))
    print(f"wrote {out / 'object_storage.json'}")


if __name__ == "__main__":
    typer.run(command)
