"""The options of a training run that ``janus-train run`` takes itself and passes on to every rank's
``pipelines.train``: declared once, for both commands (typer-annotated types, no torch)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

OutOption = Annotated[Path, typer.Option("--out", help="Run directory: checkpoints, metrics, export.")]
CacheOption = Annotated[Optional[list[str]], typer.Option(
    help="Cache directory (or s3://BUCKET/PREFIX, read in place) to train from; repeat as NAME=PATH:WEIGHT to draw from several zarr caches "
         "with sampling weights (e.g. --cache r2r=caches/r2r:0.7 --cache rxr=caches/rxr:0.3).")]
DataOption = Annotated[Optional[str], typer.Option(
    "--data", help="The dataset --cache was built from, as given to precompute (a path, or NAME=PATH sources "
                   "separated by spaces): refuse the cache when the dataset changed since (frames, texts, "
                   "actions, episodes).")]
ProfileOption = Annotated[Optional[str], typer.Option(
    help="Profile name or YAML path (default: the profile --out recorded, for a resume; else tiny).")]
