"""`make bench` / `janus-cache bench`: the side-by-side numbers that show what the cache buys
(live vs cached data path, storage, precompute phases, the training step, FLOPs per sample, the
training reader from a bucket of an S3 server, the GPU bench where CUDA exists;
:mod:`benchmarks.bench_run` measures them).

The command and its options only: ``--help`` and a wrong option cost no torch, the run's module is
imported when it runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from benchmarks.measure import RESULTS_DIR
from pipelines.command_line import run as run_command


def command(
    out: Annotated[Path, typer.Option(help="Where results.json, results.md and the plots go.")] = RESULTS_DIR,
    repeats: Annotated[int, typer.Option(min=1, help="Repeats per measurement.")] = 5,
    steps: Annotated[int, typer.Option(min=3, help="Training steps per path.")] = 8,
    workers: Annotated[int, typer.Option(min=1, help="Loader workers for the data-path section.")] = 2,
) -> None:
    """Measure what the cache buys and write the results.

    Live vs cached data path, storage, precompute and training, FLOPs per sample."""
    from benchmarks.bench_run import run

    run(out, repeats, steps, workers)


def main() -> None:
    run_command(command)


if __name__ == "__main__":
    main()
