"""Stage 1 entry point, started on every rank: ``torchrun --nproc_per_node N -m pipelines.precompute``.

Also runs as one plain process (``janus-cache precompute``). In two halves, so a mistake costs a
second: this module checks the command line (the format, the checksum mode, the resolution) and
that the profile and its ``--set`` overrides load, importing no torch; a start it refuses ends
every rank with one ``error:`` line. Only then is :mod:`pipelines.precompute_run` (the run: index,
frames, features, on every rank) imported and run.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from janus_cache.store.commit import CHECKSUM_MODES
from janus_cache.store.formats import DEFAULT_FORMAT, FORMATS, FORMATS_HELP
from janus_cache.store.remote.path import is_s3_url
from janus_core.profile import SET_HELP, SET_OPTION, ProfileError, load_profile
from janus_core.resolution import Resolution
from pipelines.command_line import run as run_command
from pipelines.dataset_options import IMAGE_ROOT_OPTION
from pipelines.distributed import Ranks, fail_alike
from pipelines.frozen_imports import frozen_imports

TORCHRUN_VARIABLE = "TORCHELASTIC_RUN_ID"
"""Set by torchrun (its elastic agent) in the environment of every rank it starts."""


def command(
    data: Annotated[list[str], typer.Argument(
        help="Dataset sources, in cache order: episode-folder roots or JSON/JSONL annotation files, each a bare "
             "PATH (keys as in the dataset, named after its (image) folder) or NAME=PATH (keys prefixed NAME/). A cache "
             "grows by new episodes or sources listed after the old ones.")],
    out: Annotated[str, typer.Option("--out", help="Cache directory (created or resumed), on a local disk.")],
    profile: Annotated[str, typer.Option(help="Profile name or YAML path.")] = "tiny",
    overrides: Annotated[Optional[list[str]], typer.Option(SET_OPTION, help=SET_HELP)] = None,
    image_root: Annotated[Optional[list[str]], IMAGE_ROOT_OPTION] = None,
    cache_format: Annotated[str, typer.Option("--format", help=f"{FORMATS_HELP}.")] = DEFAULT_FORMAT,
    resolution: Annotated[Optional[str], typer.Option(help="e.g. pad644; default: the profile's.")] = None,
    overwrite: Annotated[bool, typer.Option(help="Delete an existing cache at --out and start over.")] = False,
    force: Annotated[bool, typer.Option(help="Start even if the disk has less free space than planned.")] = False,
    allow_failures: Annotated[int, typer.Option(min=0, help="Samples allowed to fail before exit code 1.")] = 0,
    workers: Annotated[Optional[int], typer.Option(min=1, help="Decode processes per rank.")] = None,
    strict: Annotated[bool, typer.Option(help="Fail on any dataset problem instead of skipping.")] = False,
    checksums: Annotated[str, typer.Option(
        help="On resume, committed shards to re-hash before trusting them: none (commit record and size only), "
             "sample (1 shard in 16 + tables) or all.")] = "none",
) -> None:
    """Precompute a cache of frozen-VGGT features and frames.

    uint8 frames once per frame, VGGT features once per sample; the same command resumes, repairs or
    appends new episodes."""
    ranks = Ranks.from_env()
    if is_s3_url(out):  # the writing policy for buckets: precompute writes locally, push copies
        fail_alike(ranks, f"--out {out}: precompute writes a cache to a local disk (a bucket has no rename, append "
                          f"or lock for its shard writers); write it to a directory, then copy it with "
                          f"`janus-cache push DIR {out}`, and train from {out} in place", code=2)
    if cache_format not in FORMATS:
        raise typer.BadParameter(f"--format must be one of {', '.join(FORMATS)}, got {cache_format!r}")
    if checksums not in CHECKSUM_MODES:
        raise typer.BadParameter(f"--checksums must be one of {', '.join(CHECKSUM_MODES)}, got {checksums!r}")
    try:  # parsed at the edge: a bad name is a one-line error before any rank starts work
        parsed = Resolution.parse(resolution) if resolution is not None else None
    except ValueError as err:
        fail_alike(ranks, f"--resolution: {err}", code=2)
    try:  # the run loads it again on rank 0, under the cache's lock
        load_profile(profile, overrides or ())
    except ProfileError as err:
        fail_alike(ranks, str(err))
    # The run's half imports torch and the encoders: seconds on every rank.
    with frozen_imports():
        from pipelines.precompute_run import Options, launched, run

    opts = Options(tuple(data), Path(out), profile, cache_format, parsed, overwrite, force, allow_failures, workers, strict,
                   tuple(image_root or ()), checksums, tuple(overrides or ()))
    # torchrun names its run in every rank's environment: there a rank's uncaught exception goes to
    # torchrun's failure summary (launched); janus-cache's single process runs it bare.
    try:
        code = (launched if TORCHRUN_VARIABLE in os.environ else run)(opts)
    except KeyboardInterrupt:  # a single process's Ctrl-C (a rank ends silently: its launcher says why)
        print("stopped by SIGINT: the shards committed so far are kept; run the same command again to resume",
              file=sys.stderr, flush=True)
        code = 128 + signal.SIGINT
    raise typer.Exit(code)


def main() -> None:
    run_command(command)


if __name__ == "__main__":
    main()
