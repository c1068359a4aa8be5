"""Stage 2 entry point, started on every rank: ``torchrun --nproc_per_node N -m pipelines.train``.

Trains from a cache (``--cache PATH``; VGGT is never built), from several zarr caches drawn with
sampling weights (``--cache r2r=PATH:0.7 --cache rxr=PATH:0.3``, see ``janus_train.data.mixture``) or,
for the live baseline, from the source data (``--live-data``; VGGT runs inside the model).
Resumes from the latest checkpoint in ``--out`` when there is one, also on another number of
processes (``janus_train.checkpoint.elastic``); a checkpoint it cannot continue is one ``error:`` line.

In two halves, so a mistake costs a second: this module and :mod:`pipelines.train_start` (the
options, the ``--cache`` values, the profile and its overrides against the run directory's recorded
one, each cache's existence) import none of torch, transformers or DeepSpeed, and a start they refuse
ends every rank with one ``error:`` line; only then is :mod:`pipelines.train_run` (the cache checks
on rank 0, the run directory's record, the parts, the training, the export) imported and run.

Validation (``janus_train.loop.validation``): the profile's source, or ``--val-cache CACHE`` instead of it
(checked at start-up like the training cache); a source that cannot be used (e.g. a hold-out that
leaves no episode to train on) ends every rank with one ``error:`` line.

``--record-outputs FILE`` writes, after training, the final model's outputs on the first
``--record-samples`` samples of the data (one micro-batch; see ``Trainer.outputs_on``) as
safetensors, with the sample keys in the metadata: what an export must reproduce.

Without ``--profile`` a run that recorded one resumes with it, and one that disagrees with it on a
setting that shapes the model is refused (``janus_train.run.provenance``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from janus_core.profile import SET_HELP, SET_OPTION
from janus_train.data.sources import CacheSource, parse_cache_sources
from pipelines.command_line import run as run_command
from pipelines.distributed import Ranks, fail_alike
from pipelines.frozen_imports import frozen_imports
from pipelines.train_options import CacheOption, DataOption, OutOption, ProfileOption
from pipelines.train_start import START_ERRORS, Refused, first_refusal, missing_cache, run_settings, usage_problem


def command(
    out: OutOption,
    cache: CacheOption = None,
    live_data: Annotated[Optional[Path], typer.Option(help="Train live from source data (baseline).")] = None,
    data: DataOption = None,
    profile: ProfileOption = None,
    overrides: Annotated[Optional[list[str]], typer.Option(SET_OPTION, help=SET_HELP)] = None,
    max_steps: Annotated[Optional[int], typer.Option(min=1, help="Override train.max_steps.")] = None,
    val_cache: Annotated[Optional[str], typer.Option(
        help="Override train.val_cache (a cache to validate on: a directory or s3://BUCKET/PREFIX).")] = None,
    export_at_end: Annotated[bool, typer.Option("--export/--no-export", help="Export 16-bit HF weights at the end.")] = True,
    record_outputs_to: Annotated[Optional[Path], typer.Option(
        "--record-outputs", help="Write the final model's outputs on the first samples to this safetensors file.")] = None,
    record_samples: Annotated[int, typer.Option(min=1, help="Samples (one micro-batch) for --record-outputs.")] = 2,
) -> None:
    """Train a Qwen2.5-VL or Qwen3-VL model with VGGT-feature injection under DeepSpeed ZeRO-3, from a
    cache (or several), resuming from --out's latest checkpoint."""
    ranks = Ranks.from_env()
    if (usage := usage_problem(cache, live_data, data)) is not None:
        fail_alike(ranks, usage, code=2)
    try:
        sources = parse_cache_sources(cache) if cache else None
        prof, settings = run_settings(out, profile, overrides, cache, data, max_steps, val_cache, ranks)
        checked = list(sources or []) + (
            [CacheSource("validation", settings.val_cache, 1.0)] if settings.val_cache is not None else [])
        if (missing := first_refusal(checked, missing_cache)) is not None:
            raise Refused(missing)
    except START_ERRORS as err:
        fail_alike(ranks, str(err))
    # The run's half imports torch, transformers and DeepSpeed: several CPU-seconds on every rank.
    with frozen_imports():
        from pipelines.train_run import RunRequest, run

    run(ranks, RunRequest(out=out, profile=prof, settings=settings, sources=sources, checked=checked,
                          live_data=live_data, data=data, export_at_end=export_at_end,
                          record_outputs_to=record_outputs_to, record_samples=record_samples))


def main() -> None:
    run_command(command)


if __name__ == "__main__":
    main()
