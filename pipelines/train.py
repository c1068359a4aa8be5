"""Stage 2 entry point, started on every rank: ``torchrun --nproc_per_node N -m pipelines.train``.

Trains from a cache (``--cache``; VGGT is never built) or, for the live baseline, from the
source data (``--live-data``; VGGT runs inside the model). Resumes from the latest checkpoint in
``--out`` when there is one.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import torch.distributed as dist
import typer
from torch.distributed.elastic.multiprocessing.errors import record

from janus_cache.profile import ProfileError, load_profile
from janus_train.config import load_train_settings
from janus_train.export import export
from janus_train.trainer import CHECKPOINTS, EXPORT_DIR, Trainer


def command(
    out: Annotated[Path, typer.Option("--out", help="Run directory: checkpoints, metrics, export.")],
    cache: Annotated[Optional[Path], typer.Option(help="Cache directory to train from.")] = None,
    live_data: Annotated[Optional[Path], typer.Option(help="Train live from source data (baseline).")] = None,
    profile: Annotated[str, typer.Option(help="Profile name or YAML path.")] = "tiny",
    max_steps: Annotated[Optional[int], typer.Option(min=1, help="Override train.max_steps.")] = None,
    export_at_end: Annotated[bool, typer.Option("--export/--no-export", help="Export 16-bit HF weights at the end.")] = True,
) -> None:
    """Train Qwen2.5-VL with VGGT-feature injection under DeepSpeed ZeRO-3."""
    from dataclasses import replace

    try:
        prof = load_profile(profile)
        settings = load_train_settings(prof)
    except ProfileError as err:
        print(f"error: {err}", file=sys.stderr)
        raise typer.Exit(1)
    if max_steps is not None:
        settings = replace(settings, max_steps=max_steps)
    if cache is not None:
        from janus_cache.verify import CacheRefused, check_cache_for_training

        try:
            check_cache_for_training(cache, prof)
        except CacheRefused as err:
            print(f"error: {err}", file=sys.stderr)
            raise typer.Exit(1)
    trainer = Trainer(prof, settings, out, cache=cache, live_data=live_data)
    try:
        if trainer.resume() and trainer.rank == 0:
            print(f"resumed at step {trainer.step} (epoch {trainer.epoch}, position {trainer.position})", flush=True)
        trainer.train()
        trainer.save()
        if export_at_end and trainer.rank == 0:
            path = export(out / CHECKPOINTS, out / EXPORT_DIR, prof, settings.model_config())
            print(f"exported consolidated weights to {path}", flush=True)
        dist.barrier()
    finally:
        trainer.close()
        if dist.is_initialized():
            dist.destroy_process_group()


@record
def main() -> None:
    typer.run(command)


if __name__ == "__main__":
    main()
