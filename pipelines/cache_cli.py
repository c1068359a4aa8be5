"""`janus-cache`: the command line of the precompute stage (the launch layer's console script).

Every command exits 0 on success and non-zero with a one-line reason otherwise. A command imports
its heavy modules (torch, transformers, deepspeed) only when it runs, so ``janus-cache --help`` and
the light commands start in a fraction of a CPU-second.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Optional

import click
import typer
from typer.core import TyperGroup

from janus_core.plural import plural
from janus_core.profile import SET_HELP
from janus_core.profile import SET_OPTION as PROFILE_SET_OPTION
from pipelines.command_line import VersionOption, command_app, single_command
from pipelines.dataset_options import IMAGE_ROOT_OPTION
from pipelines.frozen_imports import frozen_imports


@dataclass(frozen=True)
class StageCommand:
    """A command that a stage's entry-point module defines (its options declared once there, for
    torchrun and for this CLI, where it runs as a single process). The module is imported only when
    the command runs or shows its own help (what it runs imports torch)."""

    module: str
    function: str = "command"

    def summary(self) -> str:
        """The command's docstring, read from the module's source without importing the module."""
        spec = importlib.util.find_spec(self.module)
        assert spec is not None and spec.origin is not None, self.module
        tree = ast.parse(Path(spec.origin).read_text(encoding="utf-8"))
        found = (node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == self.function)
        return ast.get_docstring(next(found)) or ""

    def load(self) -> click.Command:
        with frozen_imports():
            module = importlib.import_module(self.module)
        return typer.main.get_command(single_command(getattr(module, self.function)))


STAGE_COMMANDS: dict[str, StageCommand] = {
    "precompute": StageCommand("pipelines.precompute"),
    "verify": StageCommand("pipelines.verify"),
}


class CacheCommands(TyperGroup):
    """The command group: lists the stage commands by name and summary, loads one when it runs."""

    listing = False  # True while the group's own help is written: no stage module is needed for it

    def list_commands(self, ctx: click.Context) -> list[str]:
        return [*STAGE_COMMANDS, *super().list_commands(ctx)]

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        stage = STAGE_COMMANDS.get(cmd_name)
        if stage is None:
            return super().get_command(ctx, cmd_name)
        return click.Command(cmd_name, help=stage.summary()) if self.listing else stage.load()

    def format_help(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        self.listing = True
        try:
            super().format_help(ctx, formatter)
        finally:
            self.listing = False


app = command_app(
    cls=CacheCommands,
    no_args_is_help=True,
    help="Build, inspect and check janus caches of frozen-VGGT features and frames.",
)


@app.callback()
def _commands(_version: VersionOption = False) -> None:
    pass


def fail(message: str, code: int = 1) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


REPORT_OPTION = typer.Option(help="Write every dataset problem to this JSON file (the summary lists the first ones).")
SET_OPTION = typer.Option(PROFILE_SET_OPTION, help=SET_HELP)


def full_report(report: Any, path: Path | None) -> str:
    """Where the summary says the full problem report goes: ``path``, written now (``report``: the
    index's :class:`~janus_core.index.DatasetReport`), or how to get it."""
    if path is None:
        return "not written (add --report FILE)"
    try:
        path.write_text(json.dumps(report.to_dict(), indent=1, sort_keys=True) + "\n")
    except OSError as err:
        fail(f"--report {path}: cannot write it ({err.strerror or err}); choose a writable file")
    return str(path)


@app.command("sample-data")
def sample_data(
    out: Annotated[Path, typer.Argument(help="Folder to write the episode folders into.")],
    episodes: Annotated[int, typer.Option(min=1, help="Number of episodes.")] = 3,
    steps: Annotated[int, typer.Option(min=2, help="Frames per episode.")] = 14,
    seed: Annotated[int, typer.Option(help="Seed of the procedural scenes.")] = 0,
    form: Annotated[str, typer.Option(
        "--format", help="folders: episode folders; jsonl: the same images and one annotation file, "
                         "OUT/annotations.jsonl, a record per sample.")] = "folders",
) -> None:
    """Write a small synthetic dataset of 640x480 PNG frames.

    As episode folders, or (--format jsonl) the same images and an annotation file."""
    from janus_core.sample_data import ANNOTATION_FILE, SAMPLE_FORMATS, write_sample_data

    if form not in SAMPLE_FORMATS:
        fail(f"--format must be one of {', '.join(SAMPLE_FORMATS)}, got {form!r}", code=2)
    if out.exists() and any(out.iterdir()):
        fail(f"{out} exists and is not empty; choose an empty or new folder")
    write_sample_data(out, episodes=episodes, steps=steps, seed=seed, form=form)
    what = f"{plural(episodes, 'episode')} x {plural(steps, 'frame')}"
    typer.echo(f"wrote {what} to {out}" if form == "folders" else
               f"wrote {what} to {out}, annotated in {out / ANNOTATION_FILE}")


@app.command("index")
def index(
    data: Annotated[Path, typer.Argument(help="Episode-folder root, or a JSON/JSONL annotation file; several "
                                              "sources as one argument: 'r2r=DIR rxr=FILE'.")],
    profile: Annotated[str, typer.Option(help="Profile name or YAML path (sets the history size).")] = "tiny",
    overrides: Annotated[Optional[list[str]], SET_OPTION] = None,
    image_root: Annotated[Optional[list[str]], IMAGE_ROOT_OPTION] = None,
    strict: Annotated[bool, typer.Option(help="Fail on any dataset problem instead of skipping.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
    report: Annotated[Optional[Path], REPORT_OPTION] = None,
) -> None:
    """Index a dataset and print its summary and problems.

    Episodes, frames, samples, and the inputs skipped with their reasons."""
    from janus_core.index import DatasetError, build_sources_index, source_values, user_index_dir
    from janus_core.profile import ProfileError, load_profile

    try:
        prof = load_profile(profile, overrides or ())
        idx = build_sources_index(source_values(data), history=prof.cache.history, image_root=image_root,
                                  strict=strict, progress=True, subinstruction_rule=prof.cache.subinstruction_rule,
                                  cache_dir=user_index_dir(), processes=os.cpu_count() or 1)
    except (ProfileError, DatasetError, FileNotFoundError) as err:
        fail(str(err))
    summary = idx.summary()
    where = full_report(idx.report, report)
    if as_json:
        typer.echo(json.dumps(summary.to_dict(), indent=2, sort_keys=True))
    else:
        typer.echo(summary.format(where))


@app.command("profile")
def profile_cmd(
    name: Annotated[str, typer.Argument(help="Profile name (configs/profiles/NAME.yaml) or YAML path.")],
    overrides: Annotated[Optional[list[str]], SET_OPTION] = None,
) -> None:
    """Validate a profile and print the settings it resolves to."""
    from janus_core.profile import ProfileError, load_profile
    from janus_train.config import load_train_settings  # this command belongs to the launch layer

    try:
        prof = load_profile(name, overrides or ())
        train = load_train_settings(prof)
    except ProfileError as err:
        fail(str(err))
    typer.echo(f"profile {prof.name} ({prof.source})")
    typer.echo(f"  device {prof.device}, compute dtype {prof.compute_dtype}, {plural(prof.nproc_per_node, 'process')} per node")
    c = prof.cache
    typer.echo(
        f"  cache: resolution {c.resolution.name}, history {c.history}, reference frame {c.reference_frame}, "
        f"layer {c.layer}, attention {c.attention}, features {c.feature_dtype}"
        + (", ViT features cached" if c.vit_features else "")
    )
    vggt = prof.vggt.path or f"{prof.vggt.config} (random weights, seed {prof.vggt.seed})"
    typer.echo(f"  vggt: {vggt}")
    qwen = f"{prof.qwen.path}" + (f" (random weights, seed {prof.qwen.seed})" if prof.qwen.random_init else "")
    typer.echo(f"  qwen: {qwen}")
    ramp = (f" -> {train.distill_loss_weight_end} over {plural(train.distill_loss_weight_warmup_steps, 'step')}"
            if train.loss_config().ramps else "")
    typer.echo(
        f"  train: micro-batch {train.micro_batch} x accumulation {train.grad_accum}, {train.epochs} epochs, "
        f"segment weights {list(train.segment_weights)}, action weight {train.distill_loss_weight}{ramp}, "
        f"template {train.prompt_template}, {plural(train.num_workers, 'loader worker')}"
    )


@app.command("plan")
def plan_cmd(
    data: Annotated[Path, typer.Argument(help="Episode-folder root, or a JSON/JSONL annotation file; several "
                                              "sources as one argument: 'r2r=DIR rxr=FILE'.")],
    profile: Annotated[str, typer.Option(help="Profile name or YAML path.")] = "tiny",
    overrides: Annotated[Optional[list[str]], SET_OPTION] = None,
    image_root: Annotated[Optional[list[str]], IMAGE_ROOT_OPTION] = None,
    resolution: Annotated[Optional[str], typer.Option(help="e.g. pad644; default: the profile's.")] = None,
    nproc: Annotated[int, typer.Option(min=1, help="Processes the estimate assumes (total over nodes).")] = 1,
    workers: Annotated[Optional[int], typer.Option(
        min=1, help="Decode workers per process the estimate assumes (default: precompute's, this machine's "
                    "cores shared by --nproc processes).")] = None,
    probe: Annotated[int, typer.Option(min=1, help="Samples to measure.")] = 4,
    as_json: Annotated[bool, typer.Option("--json", help="Print the plan as JSON.")] = False,
    strict: Annotated[bool, typer.Option(help="Fail on any dataset problem (as precompute --strict would).")] = False,
    report: Annotated[Optional[Path], REPORT_OPTION] = None,
) -> None:
    """Estimate a cache's size and the precompute's time.

    Measured on a few real samples, per format; the dataset's problems (the samples precompute would
    skip) are summarised as `index` does."""
    from janus_core.profile import ProfileError, load_profile
    from janus_core.resolution import Resolution

    try:  # a mistake in the profile or the resolution is one line before the encoders' imports
        prof = load_profile(profile, overrides or ())
        res = Resolution.parse(resolution or prof.cache.resolution)
    except (ProfileError, ValueError) as err:
        fail(str(err))
    with frozen_imports():
        from janus_cache.plan import make_plan
        from janus_core.bases import cache_base
        from janus_core.index import DatasetError, build_sources_index, source_values, user_index_dir
        from janus_core.qwen_vit import ViTEncoder
        from janus_core.system.threads import default_decode_workers, set_compute_threads
        from janus_core.vggt.encoder import WindowEncoder

    # Timed as precompute runs: --nproc processes on this node, each with its share of the cores.
    workers = workers or default_decode_workers(nproc)
    set_compute_threads(nproc)
    try:
        idx = build_sources_index(source_values(data), history=prof.cache.history, image_root=image_root,
                                  strict=strict, subinstruction_rule=prof.cache.subinstruction_rule,
                                  cache_dir=user_index_dir(), processes=os.cpu_count() or 1)
        device = "cuda" if prof.device == "cuda" else "cpu"
        encoder = WindowEncoder.from_settings(prof.vggt, prof.cache, device)
        vit = ViTEncoder.from_profile(prof, device) if prof.cache.vit_features else None
        result = make_plan(idx, encoder, res, prof.cache.vggt_batch, probe=probe, vit=vit,
                           base=cache_base(prof.qwen.path))
    except (ProfileError, DatasetError, FileNotFoundError, ValueError) as err:
        fail(str(err))
    where = full_report(idx.report, report)
    if as_json:
        summary = idx.summary()
        problems = {"skipped": summary.skipped, "problems": list(summary.problems),
                    "problems_total": summary.problems_total}
        typer.echo(json.dumps({**result.to_dict(nproc, workers), **problems}, indent=2, sort_keys=True))
    else:
        typer.echo(f"plan for {data} ({res.name}, profile {prof.name}):")
        typer.echo(result.format(nproc, workers))
        typer.echo("\n".join(idx.report.summary_lines(where)))


@app.command("info")
def info_cmd(
    cache_text: Annotated[str, typer.Argument(metavar="CACHE", help="Cache directory, or s3://BUCKET/PREFIX.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the manifest as JSON.")] = False,
) -> None:
    """Show what a cache holds.

    Format, base, sources, window variant, features, resolutions, counts and shard state."""
    from janus_cache.keys import describe_preprocessing
    from janus_cache.store import StoreError, load_manifest, open_cache
    from janus_cache.store.layout import vit_array
    from janus_cache.store.location import cache_location, is_remote
    from janus_core.bases import BASES

    try:
        cache = cache_location(cache_text)
        manifest = load_manifest(cache)
        # Every listed resolution opened as the trainer opens it: its samples can be read.
        opened = {name: open_cache(cache, resolution=name, variant=manifest.window.name)
                  for name in manifest.resolutions}
        if is_remote(cache):
            size, where = sum(size for _, size in cache.walk_objects()), "in the bucket"
        else:
            size, where = sum(p.stat().st_size for p in cache.rglob("*") if p.is_file()), "on disk"
    except (StoreError, ValueError) as err:
        fail(str(err))
    if as_json:
        typer.echo(manifest.to_json().rstrip())
        return
    w = manifest.window
    typer.echo(f"cache {cache} ({manifest.format}, schema {manifest.schema_version}), {size / 1e6:.1f} MB {where}")
    typer.echo(f"  base: {BASES[manifest.base].name} (the stored frames are its own)")
    if manifest.dataset.sources:  # what an append lists first, in this order
        typer.echo(f"  sources (in cache order): {', '.join(manifest.dataset.sources)}")
    typer.echo(f"  window: {w.history} history frames ({w.sampling}), reference frame {w.reference_frame}, "
               f"layer {w.layer}, {w.attention} attention")
    typer.echo(f"  features: {manifest.feature_dtype} (stored as {manifest.stored_dtype}), "
               f"encoder {manifest.encoder_fingerprint[:16]}")
    typer.echo("  counts: " + ", ".join(f"{k} {v}" for k, v in manifest.counts.items()))
    for name, entry in manifest.resolutions.items():
        typer.echo(f"  resolution {name}: {plural(len(opened[name].reader), 'sample')}, frames "
                   f"{'x'.join(map(str, entry.frame_shape))}, features {'x'.join(map(str, entry.feature_shape))}, "
                   f"{describe_preprocessing(entry.preprocessing)}")
        if name in manifest.vit_features:
            vit = manifest.vit_features[name]
            vit_bytes = sum(s.nbytes for s in manifest.shards.get(vit_array(name), ()))
            typer.echo(f"  ViT features {name}: {'x'.join(map(str, vit.feature_shape))} per frame, {vit.dtype} (stored as "
                       f"{vit.stored_dtype}), {vit_bytes / 1e6:.1f} MB, ViT {vit.fingerprint[:16]} of {vit.base_model}")
    groups: dict[str, list[int]] = {}
    for array, shards in manifest.shards.items():
        # Table columns are many small arrays: one line for all of them.
        name = "tables" if array.startswith("tables/") else array
        done, total = groups.setdefault(name, [0, 0])
        groups[name] = [done + sum(1 for s in shards if s.committed), total + len(shards)]
    for name, (done, total) in groups.items():
        typer.echo(f"  {name}: {done}/{plural(total, 'shard')} committed")


THREADS_OPTION = typer.Option(min=1, help="Files transferred at once.")


def copy_cache(direction: str, local: Path, bucket: str, threads: int) -> None:
    """``janus-cache push`` or ``pull`` (``direction``) between ``local`` and the URL ``bucket``,
    with a progress bar; its summary line, or its failure as one ``error:`` line."""
    from janus_cache import transfer
    from janus_cache.store import StoreError
    from janus_cache.store.remote.path import S3Path
    from janus_core.system.lock import LockError
    from pipelines.distributed import Progress

    def note(line: str) -> None:
        typer.echo(line, err=True)

    try:
        copy = transfer.push if direction == "push" else transfer.pull
        ends = (local, S3Path.parse(bucket)) if direction == "push" else (S3Path.parse(bucket), local)
        report = copy(*ends, threads=threads, progress=Progress(enabled=True), note=note)
    except (StoreError, LockError, ValueError) as err:
        fail(str(err))
    typer.echo(report.summary(f"{direction}ed"))


@app.command("push")
def push_cmd(
    cache: Annotated[Path, typer.Argument(help="A finished cache directory.")],
    destination: Annotated[str, typer.Argument(help="s3://BUCKET/PREFIX to copy it to.")],
    threads: Annotated[int, THREADS_OPTION] = 16,
) -> None:
    """Copy a finished cache to a bucket (resumable; the manifest goes last), to read it in place."""
    copy_cache("push", cache, destination, threads)


@app.command("pull")
def pull_cmd(
    source: Annotated[str, typer.Argument(help="s3://BUCKET/PREFIX holding a cache.")],
    directory: Annotated[Path, typer.Argument(help="Local directory to copy it into (new, or a copy to update).")],
    threads: Annotated[int, THREADS_OPTION] = 16,
) -> None:
    """Copy a cache from a bucket to a local directory (resumable) and verify the copy."""
    copy_cache("pull", directory, source, threads)


@app.command("bench", add_help_option=False,
             context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def bench_cmd(ctx: typer.Context) -> None:
    """Measure what the cache buys and write the results."""
    # The benchmarks are the layer above this one (they import it), so they run as their own program.
    raise typer.Exit(subprocess.call([sys.executable, "-m", "benchmarks.bench", *ctx.args]))


def main() -> None:
    app()


if __name__ == "__main__":
    main()
