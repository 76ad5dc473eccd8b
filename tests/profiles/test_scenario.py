"""Scenario assembly from a cluster file, reference rows and measured rows; pure, no torch."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from api.cli import app
from planner import InvalidScenario, parse_scenario
from profiles.models import PRESETS
from profiles.scenario import ClusterError, assemble_scenario, merge_rows

NODES = [
    {"name": "a0", "gpu_type": "A100-80G", "gpus": 8, "zone": "east"},
    {"name": "v0", "gpu_type": "V100-32G", "gpus": 4, "zone": "west"},
]


def test_assembled_scenario_parses_and_covers_the_cluster() -> None:
    document = assemble_scenario(NODES, PRESETS["llama-7b"], global_batch_size=256)
    scenario = parse_scenario(document)
    assert scenario.model.layers == ["embedding"] + ["block"] * 32 + ["head"]
    assert set(scenario.gpu_types) == {"A100-80G", "V100-32G"}
    assert scenario.job.global_batch_size == 256
    # TP degrees beyond a node's GPU count are useless: V100 nodes have 4.
    assert max(r.tp for r in scenario.profiles if r.gpu_type == "V100-32G") == 4
    assert max(r.tp for r in scenario.profiles if r.gpu_type == "A100-80G") == 8
    # Two zones and no stated link between them: the wide-area default.
    assert [tuple(z.zones) for z in scenario.cluster.inter_zone] == [("east", "west")]


def test_measured_rows_replace_estimates_at_their_points() -> None:
    measured = {"gpu_type": "A100-80G", "kind": "block", "micro_batch": 1, "tp": 1,
                "forward_ms": 9.0, "backward_ms": 18.0, "activation_bytes": 1.0,
                "x_source": "measured"}
    document = assemble_scenario(NODES, PRESETS["gpt-1.3b"], measured_rows=[measured])
    at_point = [r for r in document["profiles"] if (r["gpu_type"], r["kind"], r["micro_batch"],
                                                    r["tp"]) == ("A100-80G", "block", 1, 1)]
    assert at_point == [measured]
    assert sum(r.get("x_source") == "estimated" for r in document["profiles"]) > 0


def test_a_local_job_declares_the_local_head_kind() -> None:
    document = assemble_scenario(NODES, PRESETS["gpt-1.3b"],
                                 job={"schedule": "local", "local_head_kind": "local_head"})
    kinds = document["model"]["kinds"]
    assert kinds["local_head"] == kinds["head"]  # built the same: same params, hands on a loss
    assert "local_head" not in document["model"]["layers"]
    assert "local_head" not in assemble_scenario(NODES, PRESETS["gpt-1.3b"])["model"]["kinds"]


def test_cluster_mapping_with_links_and_overrides() -> None:
    cluster = {"nodes": NODES[:1], "inter_node": {"bandwidth_gb_per_s": 50, "latency_us": 3},
               "gpu_types": {"A100-80G": {"hourly_usd": 1.8}}}
    scenario = parse_scenario(assemble_scenario(cluster, PRESETS["gpt-350m"]))
    assert scenario.cluster.inter_node.bandwidth_gb_per_s == 50
    assert scenario.gpu_types["A100-80G"].hourly_usd == 1.8


def test_unknown_gpu_type_says_what_to_do() -> None:
    with pytest.raises(ClusterError, match="not in the reference catalogue"):
        assemble_scenario([{"name": "x", "gpu_type": "B200", "gpus": 8}], PRESETS["llama-7b"])


def test_node_without_gpus_is_rejected() -> None:
    with pytest.raises(ClusterError, match=r"nodes\[0\] lacks \['gpus'\]"):
        assemble_scenario([{"name": "x", "gpu_type": "A100-80G"}], PRESETS["llama-7b"])


def test_model_without_rows_says_how_to_get_them() -> None:
    # tiny-gpt has no reference rows: without measured ones nothing can be planned.
    with pytest.raises(ClusterError, match="no profile rows for tiny-gpt"):
        assemble_scenario(NODES, PRESETS["tiny-gpt"])


def test_measured_rows_missing_a_kind_fail_in_the_parser() -> None:
    rows = [{"gpu_type": "cpu", "kind": "block", "micro_batch": 1, "tp": 1, "forward_ms": 1.0,
             "backward_ms": 2.0, "activation_bytes": 10}]
    cluster = {"nodes": [{"name": "c", "gpu_type": "cpu", "gpus": 1}],
               "gpu_types": {"cpu": {"memory_gib": 8}},
               "intra_node": {"cpu": {"bandwidth_gb_per_s": 2, "latency_us": 50}}}
    with pytest.raises(InvalidScenario, match="no profile row for layer kind 'embedding'"):
        assemble_scenario(cluster, PRESETS["tiny-gpt"], measured_rows=rows)


def test_merge_rows_refuses_incomplete_measured_rows() -> None:
    with pytest.raises(ClusterError, match="lacks"):
        merge_rows([], [{"gpu_type": "cpu", "kind": "block"}])


def test_scenario_command_writes_a_parseable_document(tmp_path: Path) -> None:
    nodes = tmp_path / "nodes.yaml"
    nodes.write_text(yaml.safe_dump({"nodes": NODES}))
    out = tmp_path / "scenario.json"
    result = CliRunner().invoke(app, ["scenario", "--cluster", str(nodes), "--model",
                                      "llama-7b", "--global-batch", "64", "-o", str(out)])
    assert result.exit_code == 0, result.output
    scenario = parse_scenario(json.loads(out.read_text()))
    assert scenario.job.global_batch_size == 64


def test_scenario_command_with_unknown_model_fails_cleanly(tmp_path: Path) -> None:
    nodes = tmp_path / "nodes.yaml"
    nodes.write_text(yaml.safe_dump(NODES))
    result = CliRunner().invoke(app, ["scenario", "--cluster", str(nodes), "--model", "gpt-9"])
    assert result.exit_code == 2
    assert "unknown model" in result.output


def test_cli_and_pure_modules_work_without_torch() -> None:
    # Block `import torch` in a fresh interpreter: help, scenario assembly and
    # upload must not need it.
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "from typer.testing import CliRunner\n"
        "from api.cli import app\n"
        "import profiles.estimate, profiles.reference, profiles.scenario, profiles.upload\n"
        "result = CliRunner().invoke(app, ['--help'])\n"
        "assert result.exit_code == 0, result.output\n"
        "result = CliRunner().invoke(app, ['profile', 'layers', '--model', 'tiny-gpt'])\n"
        "assert result.exit_code == 2 and 'needs PyTorch' in result.output, result.output\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr
