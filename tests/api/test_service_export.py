"""One export surface: every format and its options give the same answer from Python
(`planner.export.export_with_scenario`), from `hetplan export` and from
`GET /v1/plans/{id}/export`, refusals included."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import planner
from api.cli import app
from api.cli.launch_commands import ExportFormat as CliExportFormat
from api.schemas import ExportFormat as ApiExportFormat
from planner import UnsupportedExport
from planner.export import FORMATS, export_with_scenario, format_options
from tests.api.conftest import MakeClient, fixed_solver

COMMON = {"master_port": 1234, "training_module": "mypkg.train", "plan_path": "/plans/p.json",
          "script_args": ["--steps", "3"]}
OPTIONS: dict[str, dict[str, Any]] = {
    "torchrun": {**COMMON, "master_addr": "10.0.0.1"},
    "pipelining": {},
    "megatron": {},
    "deepspeed": {"zero_stage": 1},
    "torchtitan": {},
    "kubernetes": {**COMMON, "name": "job", "image": "registry.example/train:1",
                   "gpu_names": {"A100-80G": "NVIDIA-A100-SXM4-80GB"}},
    "slurm": {**COMMON, "name": "job", "gpu_names": {"V100-32G": "v100"}},
}


def _cli_args(options: dict[str, Any]) -> list[str]:
    args: list[str] = []
    for name, value in options.items():
        if name == "script_args":
            args += [f"--script-arg={arg}" for arg in value]
        elif name == "gpu_names":
            args += [f"--gpu-name={t}={n}" for t, n in value.items()]
        else:
            args += [f"--{name.replace('_', '-')}", str(value)]
    return args


def _query(fmt: str, options: dict[str, Any]) -> list[tuple[str, str]]:
    params = [("format", fmt)]
    for name, value in options.items():
        if name == "script_args":
            params += [("script_arg", arg) for arg in value]
        elif name == "gpu_names":
            params += [("gpu_name", f"{t}={n}") for t, n in value.items()]
        else:
            params.append((name, str(value)))
    return params


def _python(plan_document: dict[str, Any], scenario: dict[str, Any], fmt: str,
            options: dict[str, Any]) -> dict[str, Any]:
    try:
        return json.loads(json.dumps(export_with_scenario(
            planner.parse_plan(plan_document), fmt, planner.parse_scenario(scenario), options)))
    except UnsupportedExport as error:
        return {"reasons": error.reasons}


def _cli(tmp_path: Path, plan_document: dict[str, Any], scenario: dict[str, Any], fmt: str,
         options: dict[str, Any]) -> dict[str, Any]:
    (tmp_path / "plan.json").write_text(json.dumps(plan_document))
    (tmp_path / "scenario.json").write_text(json.dumps(scenario))
    result = CliRunner().invoke(app, ["export", str(tmp_path / "plan.json"), "--format", fmt,
                                      "--scenario", str(tmp_path / "scenario.json"),
                                      *_cli_args(options)])
    if result.exit_code == 3:
        return {"reasons": [line.removeprefix("  - ") for line in
                            result.stderr.splitlines()[1:]]}
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_python_cli_and_http_export_alike(fmt: str, make_client: MakeClient,
                                          scenario: dict[str, Any],
                                          plan_document: dict[str, Any],
                                          tmp_path: Path) -> None:
    options = OPTIONS[fmt]
    assert set(options) <= format_options(fmt)
    client = make_client(solver=fixed_solver(plan_document))
    plan_id = client.post("/v1/plans", json={"scenario": scenario}).json()["id"]
    response = client.get(f"/v1/plans/{plan_id}/export", params=_query(fmt, options))
    over_http = response.json()
    if response.status_code == 422:
        assert over_http["error"] == "unsupported_export"
        over_http = {"reasons": over_http["reasons"]}
    else:
        assert response.status_code == 200
    expected = _python(plan_document, scenario, fmt, options)
    assert over_http == expected
    assert _cli(tmp_path, plan_document, scenario, fmt, options) == expected


def test_every_format_is_offered_by_the_cli_and_the_api() -> None:
    assert {f.value for f in CliExportFormat} == set(FORMATS)
    assert {f.value for f in ApiExportFormat} == set(FORMATS)


def test_an_option_the_format_does_not_take_is_refused_everywhere(
        make_client: MakeClient, scenario: dict[str, Any], plan_document: dict[str, Any],
        tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['zero_stage'\]"):
        export_with_scenario(planner.parse_plan(plan_document), "torchrun", None,
                             {"zero_stage": 1})
    (tmp_path / "plan.json").write_text(json.dumps(plan_document))
    result = CliRunner().invoke(app, ["export", str(tmp_path / "plan.json"), "--format",
                                      "torchrun", "--zero-stage", "1"])
    assert result.exit_code == 2 and "zero_stage" in result.stderr
    client = make_client(solver=fixed_solver(plan_document))
    plan_id = client.post("/v1/plans", json={"scenario": scenario}).json()["id"]
    response = client.get(f"/v1/plans/{plan_id}/export",
                          params={"format": "torchrun", "zero_stage": 1})
    assert response.status_code == 422
    assert response.json()["error"] == "invalid_request"
    assert "zero_stage" in response.json()["message"]


def test_a_gpu_name_without_equals_is_refused_over_http(
        make_client: MakeClient, scenario: dict[str, Any], plan_document: dict[str, Any]) -> None:
    client = make_client(solver=fixed_solver(plan_document))
    plan_id = client.post("/v1/plans", json={"scenario": scenario}).json()["id"]
    response = client.get(f"/v1/plans/{plan_id}/export",
                          params={"format": "slurm", "gpu_name": "v100"})
    assert response.status_code == 422
    assert "TYPE=NAME" in response.json()["message"]
