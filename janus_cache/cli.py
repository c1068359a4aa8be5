"""`janus-cache`: the command line of the precompute stage.

Every command exits 0 on success and non-zero with a one-line reason otherwise.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Build, inspect and check janus caches of frozen-VGGT features and frames.",
)


def fail(message: str, code: int = 1) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


@app.command("sample-data")
def sample_data(
    out: Annotated[Path, typer.Argument(help="Folder to write the episode folders into.")],
    episodes: Annotated[int, typer.Option(min=1, help="Number of episodes.")] = 3,
    steps: Annotated[int, typer.Option(min=2, help="Frames per episode.")] = 14,
    seed: Annotated[int, typer.Option(help="Seed of the procedural scenes.")] = 0,
) -> None:
    """Write a small synthetic dataset in the episode-folder format (640x480 PNG frames)."""
    from janus_cache.sample_data import write_sample_data

    if out.exists() and any(out.iterdir()):
        fail(f"{out} exists and is not empty; choose an empty or new folder")
    write_sample_data(out, episodes=episodes, steps=steps, seed=seed)
    typer.echo(f"wrote {episodes} episodes x {steps} frames to {out}")


@app.command("index")
def index(
    data: Annotated[Path, typer.Argument(help="Episode-folder root, or a JSON/JSONL annotation file.")],
    profile: Annotated[str, typer.Option(help="Profile name or YAML path (sets the history size).")] = "tiny",
    image_root: Annotated[
        Optional[Path], typer.Option(help="Image root of an annotation file (default: its folder).")
    ] = None,
    strict: Annotated[bool, typer.Option(help="Fail on any dataset problem instead of skipping.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
) -> None:
    """Index a dataset and print its summary: episodes, frames, samples and skipped inputs."""
    from janus_cache.dataset import DatasetError, build_index
    from janus_cache.profile import ProfileError, load_profile

    try:
        prof = load_profile(profile)
        idx = build_index(data, history=prof.cache.history, image_root=image_root, strict=strict)
    except (ProfileError, DatasetError, FileNotFoundError) as err:
        fail(str(err))
    summary = idx.summary()
    if as_json:
        typer.echo(json.dumps(summary.to_dict(), indent=2, sort_keys=True))
    else:
        typer.echo(summary.format())


@app.command("profile")
def profile_cmd(
    name: Annotated[str, typer.Argument(help="Profile name (configs/profiles/NAME.yaml) or YAML path.")],
) -> None:
    """Validate a profile and print the settings it resolves to."""
    from janus_cache.profile import ProfileError, load_profile

    try:
        prof = load_profile(name)
    except ProfileError as err:
        fail(str(err))
    typer.echo(f"profile {prof.name} ({prof.source})")
    typer.echo(f"  device {prof.device}, compute dtype {prof.compute_dtype}, {prof.nproc_per_node} processes per node")
    c = prof.cache
    typer.echo(
        f"  cache: resolution {c.resolution.name}, history {c.history}, reference frame {c.reference_frame}, "
        f"layer {c.layer}, attention {c.attention}, features {c.feature_dtype}"
    )
    vggt = prof.vggt.path or f"{prof.vggt.config} (random weights, seed {prof.vggt.seed})"
    typer.echo(f"  vggt: {vggt}")
    qwen = f"{prof.qwen.path}" + (f" (random weights, seed {prof.qwen.seed})" if prof.qwen.random_init else "")
    typer.echo(f"  qwen: {qwen}")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
