"""How every command reports: a user error is one line on stderr and an exit code (never a
traceback); tables and progress go to stderr, documents and `--json` answers to stdout.

Imports stay light (typer only): `hetplan --help` loads this module.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["fail", "stderr_console", "load_document", "write_json", "USAGE_ERROR",
           "nothing_left_to_clean", "may_exit_at_once"]

USAGE_ERROR = 2
"""Exit code of a bad argument or document (click's code for usage errors)."""


def fail(message: str, code: int = USAGE_ERROR) -> typer.Exit:
    """Print `error: message` on one line of stderr; raise the returned Exit.

    A message of several lines (a planner error listing its problems as `  - ...`)
    becomes its first line followed by the others, separated by semicolons."""
    first, *rest = [line.strip() for line in message.strip().splitlines() if line.strip()] or [""]
    details = "; ".join(line.removeprefix("- ") for line in rest)
    separator = " " if first.endswith(":") else ": "
    typer.echo(f"error: {first}{separator + details if details else ''}", err=True)
    return typer.Exit(code)


_console: list[Console] = []
_clean_state: list[bool] = []


def nothing_left_to_clean() -> None:
    """Say that the running command holds nothing that needs Python's own shutdown (no
    child process, thread, server, database or open file of its own): the console script
    may then end the process without it. After a search, that shutdown frees the heap of
    templates and tables object by object: 0.15 s of a 1.6 s `hetplan plan` at 512 GPUs
    (BENCHMARKS 8)."""
    _clean_state.append(True)


def may_exit_at_once() -> bool:
    """Whether the command that ran said `nothing_left_to_clean` (the console script asks
    once, after it; the answer is then forgotten)."""
    said = bool(_clean_state)
    _clean_state.clear()
    return said


def stderr_console() -> Console:
    """A rich console on stderr, made (and rich imported) on first use."""
    if not _console:
        from rich.console import Console

        _console.append(Console(stderr=True))
    return _console[0]


def load_document(path: Path) -> Any:
    """A JSON or YAML document from disk, or a one-line error saying what is wrong."""
    try:
        text = path.read_text()
    except OSError as error:
        raise fail(f"cannot read {path}: {error.strerror}") from None
    if path.suffix.lower() not in {".yaml", ".yml"}:
        try:
            return json.loads(text)
        except json.JSONDecodeError as error:
            raise fail(f"{path} is not valid JSON/YAML: {error}") from None
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as error:
        reason = " ".join(str(error).split())
        raise fail(f"{path} is not valid JSON/YAML: {reason}") from None


def write_json(data: Any, output: Path | None, *, indent: int = 1) -> None:
    """`data` as JSON on stdout, or into `output` (saying so on stderr)."""
    text = json.dumps(data, indent=indent) + "\n"
    if output is None:
        sys.stdout.write(text)
        return
    try:
        output.write_text(text)
    except OSError as error:
        raise fail(f"cannot write {output}: {error.strerror}") from None
    typer.echo(f"wrote {output}", err=True)
