"""Every user error of every command is one line on stderr and an exit code: no traceback,
no usage box. Each case is one way a user gets a command wrong."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner

from api.cli import app

ROOT = Path(__file__).parents[2]
SCENARIO = ROOT / "tests" / "data" / "scenarios" / "a80x16-v32x16-gpt1.3b.json"
PLAN = ROOT / "tests" / "api" / "data" / "plan.json"
PLAN_34_LAYERS_4_GPUS = (ROOT / "tests" / "launcher" / "data" /
                         "a40x32-t4x32-l4x16-gpt2.7b.onenic.random0.plan.json")
PLAN_30_GPUS = ROOT / "tests" / "launcher" / "data" / "a80x16-v32x16-gpt1.3b.gpipe.random1.plan.json"
CLOSED_PORT_URL = "http://127.0.0.1:9"  # discard port: nothing listens there


@dataclass(frozen=True)
class Case:
    name: str
    args: list[str]
    says: str
    """Part of the one line the user must see."""
    code: int = 2


def files(tmp_path: Path) -> dict[str, Path]:
    """Bad inputs, written once per test."""
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    zero_gpus = json.loads(SCENARIO.read_text())
    zero_gpus["cluster"]["nodes"][0]["gpus"] = 0
    bad_scenario = tmp_path / "zero-gpus.json"
    bad_scenario.write_text(json.dumps(zero_gpus))
    not_a_plan = tmp_path / "not-a-plan.json"
    not_a_plan.write_text(json.dumps({"pipelines": []}))
    zero_node = tmp_path / "nodes.json"
    zero_node.write_text(json.dumps([{"name": "a0", "gpu_type": "A100-80G", "gpus": 8},
                                     {"name": "spare", "gpu_type": "A100-80G", "gpus": 0}]))
    rows_not_list = tmp_path / "rows.json"
    rows_not_list.write_text(json.dumps({"rows": []}))
    empty_dir = tmp_path / "empty"
    empty_dir.mkdir()
    return {"broken": broken, "bad_scenario": bad_scenario, "not_a_plan": not_a_plan,
            "zero_node": zero_node, "rows_not_list": rows_not_list, "empty_dir": empty_dir,
            "missing": tmp_path / "missing.json", "file": broken,
            "unwritable": tmp_path / "no-such-folder" / "plan.json"}


def cases(f: dict[str, Path]) -> list[Case]:
    s, p = str(SCENARIO), str(PLAN)
    return [
        Case("unknown command", ["plam"], "No such command"),
        Case("plan: missing file", ["plan", str(f["missing"])], "cannot read"),
        Case("plan: not JSON", ["plan", str(f["broken"])], "not valid JSON/YAML"),
        Case("plan: invalid scenario", ["plan", str(f["bad_scenario"])], "cluster.nodes[0].gpus"),
        Case("plan: time limit below zero", ["plan", s, "--time-limit", "-1"], "--time-limit"),
        Case("plan: unknown option", ["plan", s, "--time-limit-s", "1"], "No such option"),
        Case("plan: unreachable server", ["plan", s, "--server", CLOSED_PORT_URL],
             "cannot connect"),
        Case("plan: unwritable output", ["plan", s, "--time-limit", "0.5", "-o",
                                         str(f["unwritable"])], "cannot write"),
        Case("evaluate: missing plan", ["evaluate", s, str(f["missing"])], "cannot read"),
        Case("evaluate: not a plan", ["evaluate", s, str(f["not_a_plan"])], "pipelines"),
        Case("evaluate: invalid scenario", ["evaluate", str(f["bad_scenario"]), p],
             "cluster.nodes[0].gpus"),
        Case("serve: public address without tokens", ["serve", "--host", "0.0.0.0"],
             "refusing to serve"),
        Case("batch: no scenarios", ["batch", str(f["empty_dir"]), "--out",
                                     str(f["empty_dir"] / "o")], "no scenario files"),
        Case("batch: folder missing", ["batch", str(f["missing"]), "--out", "o"], "does not exist"),
        Case("batch: old option spelling", ["batch", str(f["empty_dir"]), "--out", "o",
                                            "--time-limit-s", "1"], "No such option"),
        Case("scenario: unknown model", ["scenario", "--cluster", str(f["zero_node"]),
                                         "--model", "gpt-9"], "unknown model"),
        Case("scenario: node without GPUs", ["scenario", "--cluster", str(f["zero_node"]),
                                             "--model", "llama-7b"], "gpus: 0"),
        Case("scenario: measured rows not a list", [
            "scenario", "--cluster", str(f["zero_node"]), "--model", "llama-7b",
            "--profiles", str(f["rows_not_list"])], "must hold a JSON list"),
        Case("rankmap: not JSON", ["rankmap", str(f["broken"])], "not valid JSON/YAML"),
        Case("rankmap: not a plan", ["rankmap", str(f["not_a_plan"])], "pipelines"),
        Case("export: unknown format", ["export", p, "--format", "slurmish"], "--format"),
        Case("export: inexpressible plan", ["export", str(PLAN_30_GPUS), "-f", "deepspeed"],
             "cannot be exported as deepspeed", code=3),
        Case("launch: too many processes", ["launch", str(PLAN_30_GPUS)], "--max-processes"),
        Case("launch: unknown schedule", ["launch", str(PLAN_34_LAYERS_4_GPUS), "--schedule",
                                          "zigzag"], "--schedule 'zigzag'"),
        Case("schema: unknown document", ["schema", "cluster"], "cluster"),
        Case("show: plan file without its scenario", ["show", p], "--scenario"),
        Case("show: not a plan", ["show", str(f["not_a_plan"]), "--scenario", s], "pipelines"),
        Case("show: unreachable server", ["show", "0123abcd", "--server", CLOSED_PORT_URL],
             "cannot connect"),
    ]


def assert_one_line_error(result: object, case: Case) -> None:
    stderr = result.stderr  # type: ignore[attr-defined]
    assert result.exit_code == case.code, (case.name, result.output)  # type: ignore[attr-defined]
    assert "Traceback" not in result.output, (case.name, result.output)  # type: ignore[attr-defined]
    assert len(stderr.strip().splitlines()) == 1, (case.name, stderr)
    assert stderr.startswith("error: "), (case.name, stderr)
    assert case.says in stderr, (case.name, stderr)


def test_every_user_error_is_one_line_and_an_exit_code(tmp_path: Path) -> None:
    runner = CliRunner()
    for case in cases(files(tmp_path)):
        assert_one_line_error(runner.invoke(app, case.args), case)


@pytest.mark.parametrize("args, says", [
    (["--model", "gpt-9"], "unknown model 'gpt-9'"),
    (["--model", "tiny-gpt"], "the plan splits 34 layers but model tiny-gpt has 4"),
])
def test_launch_checks_model_and_plan_before_starting_processes(
        args: list[str], says: str, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("torch")
    import profiles.distributed

    def no_spawn(*_: object, **__: object) -> None:
        raise AssertionError("launch started processes for a plan it should have refused")

    monkeypatch.setattr(profiles.distributed.mp, "spawn", no_spawn)
    result = CliRunner().invoke(app, ["launch", str(PLAN_34_LAYERS_4_GPUS), *args])
    assert_one_line_error(result, Case("launch", args, says))


@pytest.mark.parametrize("command", [["profile", "layers", "--model", "tiny-gpt"],
                                     ["profile", "links"]])
def test_profiling_without_torch_names_the_extra_to_install(
        command: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` now fails
    result = CliRunner().invoke(app, command)
    assert_one_line_error(result, Case("no torch", command, "pip install 'hetplan[torch]'"))
