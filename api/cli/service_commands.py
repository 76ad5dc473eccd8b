"""Commands of this family are added by their owner's change."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    del app
