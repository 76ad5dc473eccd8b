"""The `hetplan` command line: one typer app; each command family registers itself."""

from __future__ import annotations

import typer

from api.cli import (
    cost_commands,
    launch_commands,
    plan_commands,
    profile_commands,
    service_commands,
)

app = typer.Typer(
    name="hetplan",
    help="Plan training of large models on heterogeneous GPU clusters.",
    no_args_is_help=True,
    add_completion=False,
)

for family in (plan_commands, service_commands, profile_commands, launch_commands, cost_commands):
    family.register(app)


def main() -> None:
    app()
