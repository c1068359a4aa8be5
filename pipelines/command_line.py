"""How janus's commands are made with typer, once: click's plain help and errors, and ``--version``.

Typer draws help as boxed tables when rich is installed: at 80 columns a long option list leaves
its help column ~25 characters wide, and a docstring's own line breaks survive in the list of
commands. Click's formatter wraps each option's help at the terminal's width and lists a command by
its first sentence; its errors are one ``Error:`` line after the usage.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

import typer

PLAIN: dict[str, Any] = {"add_completion": False, "rich_markup_mode": None}
"""The typer settings of every janus command."""


def command_app(**settings: Any) -> typer.Typer:
    """A typer app of janus (a command group, or one command: :func:`run`)."""
    return typer.Typer(**PLAIN, **settings)


def single_command(function: Callable[..., Any]) -> typer.Typer:
    """``function`` as an app of its own (its parameters the options)."""
    app = command_app()
    app.command()(function)
    return app


def run(function: Callable[..., Any]) -> None:
    """Run ``function`` as a command with the process's arguments (what ``typer.run`` does)."""
    single_command(function)()


def version_line() -> str:
    """janus's version, and the git commit of the checkout it runs from (with uncommitted changes)."""
    import importlib.metadata

    from janus_train.run.provenance import git_state

    try:
        version = importlib.metadata.version("janus")
    except importlib.metadata.PackageNotFoundError:
        version = "(not installed)"
    git = git_state()
    commit = git["git_commit"]
    where = (f" (git {commit[:12]}{', with uncommitted changes' if git['git_dirty'] else ''})"
             if commit is not None else "")
    return f"janus {version}{where}"


def _show_version(value: bool) -> None:
    if value:
        typer.echo(version_line())
        raise typer.Exit()


VersionOption = Annotated[bool, typer.Option(
    "--version", is_eager=True, callback=_show_version, help="Show janus's version and exit.")]
