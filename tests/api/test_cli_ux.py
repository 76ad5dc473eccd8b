"""The command line as a user meets it: fast help, --version, completion, one spelling per
option, no type column, JSON summaries, and the same summary from a server as locally."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

from typer.main import get_command
from typer.testing import CliRunner

from api.cli import app
from tests.live_server import serving

ROOT = Path(__file__).parents[2]
TINY = ROOT / "tests" / "launcher" / "data" / "tiny-scenario.json"
HEAVY_MODULES = ("planner", "ortools", "torch", "fastapi", "api.app", "numpy", "sqlalchemy")

runner = CliRunner()


def test_help_imports_nothing_heavy() -> None:
    code = ("import sys\nfrom api.cli import app\ntry:\n    app(['--help'])\n"
            "except SystemExit:\n    pass\n"
            f"print([m for m in {HEAVY_MODULES!r} if m in sys.modules])")
    loaded = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                            text=True, check=True).stdout.strip().splitlines()[-1]
    assert loaded == "[]"


def test_version_is_the_package_version() -> None:
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.stdout.strip() == f"hetplan {version('hetplan')}"


def test_shell_completion_is_offered() -> None:
    result = runner.invoke(app, ["--help"])
    assert "--install-completion" in result.stdout and "--show-completion" in result.stdout


def all_commands() -> dict[str, object]:
    """Command path -> click command, for every command and subcommand."""
    found: dict[str, object] = {}

    def walk(command: object, path: str) -> None:
        found[path] = command
        for name, sub in getattr(command, "commands", {}).items():
            walk(sub, f"{path} {name}")

    walk(get_command(app), "hetplan")
    return found


def test_each_option_has_one_spelling_across_commands() -> None:
    spellings: dict[str, set[tuple[str, ...]]] = {}
    for command in all_commands().values():
        for param in command.params:  # type: ignore[attr-defined]
            if param.param_type_name == "option":
                spellings.setdefault(param.name, set()).add(tuple(sorted(param.opts)))
    several = {name: s for name, s in spellings.items() if len(s) > 1}
    assert not several, f"options spelled differently in different commands: {several}"
    assert spellings["time_limit_s"] == {("--time-limit",)}
    assert spellings["output"] == {("--output", "-o")}


def test_help_shows_no_type_of_flags_and_breaks_no_sentence() -> None:
    for path in all_commands():
        args = [*path.split()[1:], "--help"]
        text = runner.invoke(app, args, terminal_width=100).stdout
        assert "<bool>" not in text, path
        commands = text.split("Commands:")[1] if "Commands:" in text else ""
        cut = [line for line in commands.splitlines() if line.rstrip().endswith("...")]
        assert not cut, f"{path}: command summaries cut mid-sentence: {cut}"


def test_plan_json_summary_on_stdout(tmp_path: Path) -> None:
    out = tmp_path / "plan.json"
    result = runner.invoke(app, ["plan", str(TINY), "--time-limit", "2", "--json", "-o", str(out)])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    plan = json.loads(out.read_text())
    assert summary["iteration_s"] == plan["estimate"]["iteration_s"]
    assert summary["status"] == plan["search"]["status"]
    assert set(summary["baselines_samples_per_s"]) == set(plan["search"]["baselines_samples_per_s"])
    assert summary["upper_bound_samples_per_s"] == plan["search"]["upper_bound_samples_per_s"]
    assert summary["samples_per_s"] <= summary["upper_bound_samples_per_s"]
    assert summary["output"] == str(out)


def test_batch_json_summary_on_stdout(tmp_path: Path) -> None:
    folder = tmp_path / "scenarios"
    folder.mkdir()
    (folder / "tiny.json").write_text(TINY.read_text())
    result = runner.invoke(app, ["batch", str(folder), "--out", str(tmp_path / "plans"),
                                 "--jobs", "1", "--time-limit", "1", "--json"])
    assert result.exit_code == 0, result.output
    [outcome] = json.loads(result.stdout)
    assert outcome["scenario"] == "tiny.json" and outcome["ok"] is True
    assert json.loads(Path(outcome["plan_path"]).read_text())["format"] == "hetplan-plan/1"


def summary_shape(stderr: str) -> list[str]:
    """The summary's lines with numbers blanked out, without the lines naming files."""
    return [re.sub(r"\d+(\.\d+)?", "#", line).rstrip() for line in stderr.splitlines()
            if line.strip() and "plan written to" not in line
            and not line.startswith("stored on the server")]


def test_plan_on_a_server_prints_what_a_local_run_prints(tmp_path: Path) -> None:
    local = runner.invoke(app, ["plan", str(TINY), "--time-limit", "2", "-o",
                                str(tmp_path / "local.json")])
    with serving(tmp_path / "server.db") as url:
        remote = runner.invoke(app, ["plan", str(TINY), "--time-limit", "2", "--server", url,
                                     "-o", str(tmp_path / "remote.json")])
    assert local.exit_code == remote.exit_code == 0, (local.output, remote.output)
    assert "baseline" in local.stderr and "left idle" in local.stderr
    assert "upper bound: " in local.stderr
    assert summary_shape(remote.stderr) == summary_shape(local.stderr)
    assert "on the server" in remote.stderr


def test_the_clis_torchrun_port_is_the_exporters() -> None:
    from api.cli import launch_commands
    from planner.export import formats

    assert launch_commands.DEFAULT_MASTER_PORT == formats.DEFAULT_MASTER_PORT
