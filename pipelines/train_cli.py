"""`janus-train`: start (or resume) a training run, export it, show a sample as it trains.

``janus-train run`` replaces itself with janus's torchrun launcher (``pipelines.launch``: the same
process, so a stop signal sent to it reaches the ranks), which starts ``pipelines.train`` on every
rank; the other commands run as one process."""

from __future__ import annotations

import contextlib
import os
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import click
import typer

from janus_core.profile import SET_HELP, SET_OPTION
from janus_train.model.export_formats import FORMATS, JANUS, JANUSVLN
from pipelines.command_line import VersionOption, command_app, single_command
from pipelines.frozen_imports import frozen_imports
from pipelines.train_options import CacheOption, DataOption, OutOption, ProfileOption

if TYPE_CHECKING:
    from janus_train.run.layout import RunLayout

app = command_app(no_args_is_help=True, help="Train from janus caches and export the result.")

TRAIN_MODULE = "pipelines.train"
"""What torchrun starts on every rank; ``janus-train run --help-train`` prints its options."""


@app.callback()
def _commands(_version: VersionOption = False) -> None:
    # With a single command and no callback, typer would make `export` the program itself and
    # refuse `janus-train export RUN`; the callback keeps the command group.
    pass


def _help_train(value: bool) -> None:
    """Every rank's options, as this command passes them on (``pipelines.train``'s own help)."""
    if value:
        from pipelines.train import command

        train = typer.main.get_command(single_command(command))
        typer.echo(train.get_help(click.Context(train, info_name="janus-train run")))
        raise typer.Exit()


@app.command("run", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def run_cmd(
    ctx: typer.Context,
    out: OutOption,
    cache: CacheOption = None,
    data: DataOption = None,
    profile: ProfileOption = None,
    overrides: Annotated[Optional[list[str]], typer.Option(SET_OPTION, help=SET_HELP)] = None,
    nproc: Annotated[Optional[int], typer.Option(
        min=1, help="Processes on this node (default: the profile's nproc_per_node).")] = None,
    torchrun: Annotated[str, typer.Option(
        help="torchrun's own options, e.g. '--nnodes 2 --node_rank 0 --rdzv_endpoint HOST:29500' for several "
             "nodes.")] = "--standalone",
    _help: Annotated[bool, typer.Option(
        "--help-train", is_eager=True, callback=_help_train,
        help="Show every training option (--max-steps, --live-data, --no-export, ...) and exit.")] = False,
) -> None:
    """Start (or resume) a training run on this node.

    As `make train` does: torchrun with the profile's processes, each rank training with these
    options and any other training option that follows (see --help-train)."""
    from janus_core.profile import ProfileError
    from janus_train.run.layout import RunLayout
    from janus_train.run.provenance import run_profile
    from pipelines.launch import LOG_OPTION

    settings = list(overrides or ())
    if nproc is None:
        try:
            nproc = run_profile(out, profile, settings).nproc_per_node
        except ProfileError as err:
            typer.echo(f"error: {err}", err=True)
            raise typer.Exit(1)
    passed = [*(a for c in cache or () for a in ("--cache", c)), *(("--data", data) if data is not None else ()),
              *(("--profile", profile) if profile is not None else ()), *(a for s in settings for a in (SET_OPTION, s))]
    argv = [sys.executable, "-m", "pipelines.launch", LOG_OPTION, str(RunLayout(out).launcher_log),
            *shlex.split(torchrun), "--nproc_per_node", str(nproc), "-m", TRAIN_MODULE, "--out", str(out), *passed,
            *ctx.args]
    if nproc > 1:
        # torchrun's own default, set here so it does not print its warning about it on every launch.
        os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.execv(sys.executable, argv)


def export_refusal(layout: RunLayout, out: Path, tag: str | None) -> str | None:
    """Why ``janus-train export`` of the run ``layout`` into ``out`` cannot start (None when it can):
    a ``--tag`` the run does not hold (the tags it does hold named), an ``--out`` that cannot be
    written. Checked before the checkpoint is read."""
    from janus_core.system.files import write_problem
    from janus_train.checkpoint.store import Checkpoints

    if tag is not None and not (layout.checkpoints / tag).is_dir():
        tags = Checkpoints(layout.checkpoints).tags() + (["best"] if layout.best.is_dir() else [])
        held = f"its tags: {', '.join(tags)}" if tags else "it holds none"
        return f"{layout.checkpoints} holds no checkpoint {tag!r} ({held}); give one of them with --tag, or leave --tag out"
    if (problem := write_problem(out)) is not None:
        return f"--out {problem}: give a folder you can write to (the checkpoints are unchanged)"
    return None


@app.command("export")
def export_cmd(
    run: Annotated[Path, typer.Argument(help="Training run directory (holds checkpoints/).")],
    out: Annotated[Path, typer.Option("--out", help="Where to write the transformers-loadable model.")],
    profile: Annotated[Optional[str], typer.Option(
        help="Profile the run was trained with (default: the one it recorded, RUN/profile.yaml).")] = None,
    overrides: Annotated[Optional[list[str]], typer.Option(SET_OPTION, help=SET_HELP)] = None,
    tag: Annotated[Optional[str], typer.Option(help="Checkpoint tag (default: the latest).")] = None,
    dtype: Annotated[Optional[str], typer.Option(help="float32 or bfloat16 (default: the profile's).")] = None,
    fmt: Annotated[str, typer.Option(
        "--format", help="janus: transformers-5 weights + janus heads; janusvln: a reference JanusVLN checkpoint "
        "directory (transformers 4.50, VGGT included).")] = JANUS,
    vggt: Annotated[Optional[Path], typer.Option(
        help="--format janusvln: the VGGT checkpoint to include (default: the profile's vggt.path, or its "
             "seeded random VGGT when it names none).")] = None,
) -> None:
    """Export a run's checkpoint as a model directory.

    Consolidates a ZeRO-3 checkpoint into 16-bit (or fp32) weights: transformers' model plus the
    janus heads, or a reference JanusVLN checkpoint directory."""
    from janus_core.profile import ProfileError
    from janus_train.config import load_train_settings
    from janus_train.run.layout import RunLayout
    from janus_train.run.provenance import profile_edits_note, run_profile

    layout = RunLayout(run)
    try:
        prof = run_profile(run, profile, overrides or (), default=None)
        settings = load_train_settings(prof)
    except ProfileError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(1)
    if profile is None and (note := profile_edits_note(run)) is not None:
        typer.echo(note, err=True)
    if (problem := export_refusal(layout, out, tag)) is not None:
        typer.echo(f"error: {problem}", err=True)
        raise typer.Exit(1)
    # After the profile's checks: a run refused there costs no torch, transformers or DeepSpeed.
    with frozen_imports():
        from janus_train.checkpoint.export import export_as
        from janus_train.checkpoint.reference import ReferenceCheckpointError
        from pipelines.library_output import library_chatter_hidden, name_deepspeed_accelerator

    if fmt not in FORMATS:
        typer.echo(f"error: --format must be one of {', '.join(FORMATS)}, got {fmt!r}", err=True)
        raise typer.Exit(2)
    if fmt == JANUSVLN and vggt is not None and vggt.suffix == ".json":
        typer.echo(f"error: --vggt {vggt} is an aggregator config, not a VGGT checkpoint (model.safetensors or "
                   f"model.pt); leave --vggt out to include the profile's own VGGT", err=True)
        raise typer.Exit(2)
    vggt = vggt if vggt is not None else prof.vggt.path
    if not layout.latest.is_file() and tag is None:
        typer.echo(f"error: {layout.checkpoints} holds no checkpoint", err=True)
        raise typer.Exit(1)
    if fmt == JANUSVLN and vggt is None:
        # A profile without a VGGT checkpoint (tiny) trains on features of its seeded random VGGT.
        typer.echo(f"note: profile {prof.name} names no vggt.path: the export holds its own VGGT, seeded random "
                   f"weights from {prof.vggt.config} (seed {prof.vggt.seed}), the encoder its caches were made with; "
                   f"--vggt PATH includes a checkpoint instead", err=True)
    name_deepspeed_accelerator(prof.device)
    try:
        with library_chatter_hidden(ReferenceCheckpointError, ValueError):
            path = export_as(fmt, layout.checkpoints, out, prof, settings, vggt, tag=tag, dtype=dtype)
    except (ReferenceCheckpointError, ValueError) as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(1)
    typer.echo(f"exported {layout.checkpoints} to {path}")


@app.command("evals")
def evals_cmd(
    run: Annotated[Path, typer.Argument(help="Training run directory (holds evals/).")],
) -> None:
    """Collect the results of a run's external evaluations (train.eval_command) that came in after it
    ended into its logs and best checkpoint, and list each evaluation's state (pending, done, failed)."""
    from janus_core.profile import ProfileError
    from janus_core.system.lock import DirectoryBusy, DirectoryLock
    from janus_train.config import load_train_settings
    from janus_train.evals.evaluations import evaluated_best, evaluations_of_run
    from janus_train.loop.logs import RunLog, WandbMissing, check_wandb, last_logged_step
    from janus_train.run.layout import RunLayout
    from janus_train.run.provenance import run_profile

    layout = RunLayout(run)
    try:
        prof = run_profile(run, None, (), default=None)
        settings = load_train_settings(prof)
    except ProfileError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(1)
    if not layout.evals.is_dir():
        typer.echo(f"{run} has no evaluations (train.eval_command: {settings.eval_command or 'empty'})")
        return
    try:
        lock = DirectoryLock.acquire(run, purpose="janus-train evals")
    except DirectoryBusy as err:  # a training run owns the evaluations: it collects them itself
        typer.echo(f"note: {err}; listing only: that run collects the results itself", err=True)
        lock = None
    with contextlib.ExitStack() as held:
        if lock is not None:
            held.callback(lock.release)
        evaluations = evaluations_of_run(layout, settings, prof, None)
        if lock is not None and evaluations.collectable():
            try:
                check_wandb(settings.wandb_project, prof.source)
            except WandbMissing as err:
                typer.echo(f"error: {err}", err=True)
                raise typer.Exit(1)
            log = RunLog(layout.root, layout.metrics, 0, settings.wandb_project,
                         run_config={"profile": prof.name, "collected_by": "janus-train evals"})
            held.callback(log.close)
            evaluations.log = log
            evaluations.collect(last_logged_step(layout.metrics))
        typer.echo(f"evaluations of {run} (train.eval_command: {settings.eval_command or 'empty'}):")
        for line in evaluations.listing():
            typer.echo(f"  {line}")
        if (best := evaluated_best(layout)) is not None:
            typer.echo(f"best by {best['metric']}: checkpoint step {best['step']} ({best['value']:.6g}), "
                       f"{layout.best}")


@app.command("show-sample")
def show_sample_cmd(
    data: Annotated[Path, typer.Option("--data", help="Episode-folder root, or a JSON/JSONL annotation file.")],
    key: Annotated[str, typer.Option("--key", help="Sample key, e.g. EPISODE/STEP.")],
    profile: Annotated[Optional[str], typer.Option(
        help="Profile name or YAML path (template, weights, resolution); default: --run's, else tiny.")] = None,
    run: Annotated[Optional[Path], typer.Option(
        "--run", help="A training run directory: show the sample as that run trains it (its recorded profile).")] = None,
    overrides: Annotated[Optional[list[str]], typer.Option(SET_OPTION, help=SET_HELP)] = None,
) -> None:
    """Print one sample as trained, token by token.

    User and target text, token counts, and the weight and segment of every supervised token."""
    with frozen_imports():
        from janus_core.index import DatasetError, build_index
        from janus_core.profile import ProfileError, load_profile
        from janus_train.build import prompt_builder
        from janus_train.data.prompt import PromptError
        from janus_train.data.sample_view import describe_sample
        from janus_train.run.provenance import run_profile

    try:
        if run is not None:
            prof = run_profile(run, profile, overrides or (), default=None)
        else:
            prof = load_profile(profile or "tiny", overrides or ())
        builder = prompt_builder(prof)
        index = build_index(data, history=prof.cache.history, subinstruction_rule=prof.cache.subinstruction_rule)
        sample = index.sample(key)
        typer.echo(describe_sample(builder, sample))
    except (ProfileError, DatasetError, PromptError, FileNotFoundError) as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(1)
    except KeyError:
        typer.echo(f"error: {data} has no sample {key!r} (keys look like {index.samples[0].key!r})", err=True)
        raise typer.Exit(1)


def main() -> None:
    app()
