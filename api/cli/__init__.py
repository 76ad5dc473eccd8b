"""The `hetplan` command line: one typer app; each command family registers itself.

Start-up is kept short (`hetplan --help` well under 0.3 s): the command modules import
only typer and the standard library at the top, and each command imports the planner,
OR-Tools, torch or the API when it runs. Help is plain text (no `<bool>` type column,
paragraphs wrapped to the terminal). Any usage error or refused document is one line on
stderr and an exit code.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

from api.cli import (
    cost_commands,
    launch_commands,
    plan_commands,
    profile_commands,
    schema_commands,
    service_commands,
    show_commands,
)

__all__ = ["app", "main"]


class OneLineErrors(TyperGroup):
    """Usage errors (unknown option, bad value, missing file) as one line on stderr,
    `error: ...`, instead of the usage text and a box."""

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None,
             complete_var: str | None = None, standalone_mode: bool = True,
             windows_expand_args: bool = True, **extra: Any) -> Any:
        options = dict(prog_name=prog_name, complete_var=complete_var,
                       windows_expand_args=windows_expand_args, **extra)
        if not standalone_mode:
            return super().main(args, standalone_mode=False, **options)
        try:
            code = super().main(args, standalone_mode=False, **options)
        except typer.TyperException as error:  # click's errors, as typer vendors them
            context = getattr(error, "ctx", None)
            hint = "" if context is None else f" (see {context.command_path} --help)"
            typer.echo(f"error: {error.format_message()}{hint}", err=True)
            sys.exit(error.exit_code)
        except typer.Abort:
            typer.echo("aborted", err=True)
            sys.exit(1)
        sys.exit(code if isinstance(code, int) else 0)


def _print_version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        typer.echo(f"hetplan {version('hetplan')}")
        raise typer.Exit()


app = typer.Typer(
    name="hetplan",
    help="Plan training of large models on heterogeneous GPU clusters.",
    no_args_is_help=True,
    rich_markup_mode=None,
    cls=OneLineErrors,
    pretty_exceptions_show_locals=False,
)


@app.callback()
def _root(
    version: Annotated[bool, typer.Option(
        "--version", callback=_print_version, is_eager=True,
        help="Print hetplan's version and exit.")] = False,
) -> None:
    """Plan training of large models on heterogeneous GPU clusters.

    Documents: docs/formats.md; the service: docs/service.md.
    """


for family in (plan_commands, service_commands, profile_commands, launch_commands,
               schema_commands, show_commands, cost_commands):
    family.register(app)


def main() -> None:
    """The console script: the app, then, for a command with nothing left to clean, the
    process ended without Python's shutdown (its output flushed first)."""
    from api.cli.output import may_exit_at_once

    may_exit_at_once()  # a command run before in this process (tests) says nothing here
    try:
        app()
    except SystemExit as end:
        if not may_exit_at_once() or not isinstance(end.code, int | None):
            raise
        _exit_at_once(end.code or 0)


def _exit_at_once(code: int) -> None:
    import logging

    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except OSError:  # a closed pipe: what Python's own shutdown would report
        code = code or 120
    logging.shutdown()
    os._exit(code)
