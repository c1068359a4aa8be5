"""The dataset options the cache commands (``janus-cache index``, ``plan`` and ``precompute``) declare
once."""

from __future__ import annotations

import typer

IMAGE_ROOT_OPTION = typer.Option(
    help="Image root of an annotation file whose image paths start elsewhere (default: the file's folder): "
         "NAME=DIR for the source named NAME (repeatable), or DIR for a single source.")
