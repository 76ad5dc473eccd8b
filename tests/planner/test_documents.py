"""Scenario validation: every problem named with its field path and remedy."""

from __future__ import annotations

import math

import pytest

from planner import InvalidScenario, parse_scenario
from tests.planner.scenarios import tiny


def problems(doc: dict) -> list[str]:
    with pytest.raises(InvalidScenario) as info:
        parse_scenario(doc)
    return [str(p) for p in info.value.problems]


def test_valid_tiny_scenario_parses() -> None:
    scenario = parse_scenario(tiny())
    assert scenario.job.grad_bytes == 4  # the documented default
    assert scenario.job.blocking_transfers is True


def test_gpus_per_type_counts_every_node_of_each_type_in_order_of_first_appearance() -> None:
    doc = tiny()
    doc["gpu_types"]["H"] = dict(doc["gpu_types"]["G"])
    doc["cluster"]["nodes"].insert(1, {"name": "h0", "gpu_type": "H", "gpus": 2})
    doc["cluster"]["intra_node"]["H"] = doc["cluster"]["intra_node"]["G"]
    doc["profiles"] += [dict(row, gpu_type="H") for row in doc["profiles"]]
    cluster = parse_scenario(doc).cluster
    assert list(cluster.gpus_per_type.items()) == [("G", 8), ("H", 2)]
    assert sum(cluster.gpus_per_type.values()) == cluster.num_gpus


def test_negative_latency_is_rejected_with_its_path() -> None:
    doc = tiny()
    doc["profiles"][0]["forward_ms"] = -1
    assert any(p.startswith("profiles[0].forward_ms") for p in problems(doc))


def test_nan_latency_is_rejected() -> None:
    doc = tiny()
    doc["profiles"][1]["backward_ms"] = math.nan
    assert any(p.startswith("profiles[1].backward_ms") for p in problems(doc))


def test_absurd_latency_is_rejected() -> None:
    doc = tiny()
    doc["profiles"][1]["backward_ms"] = 1e12
    assert any(p.startswith("profiles[1].backward_ms") for p in problems(doc))


def test_unknown_gpu_type_on_a_node_is_rejected() -> None:
    doc = tiny()
    doc["cluster"]["nodes"][1]["gpu_type"] = "H100"
    assert any("cluster.nodes[1].gpu_type" in p and "unknown GPU type" in p for p in problems(doc))


def test_node_with_zero_gpus_is_rejected() -> None:
    doc = tiny()
    doc["cluster"]["nodes"][0]["gpus"] = 0
    assert any(p.startswith("cluster.nodes[0].gpus") for p in problems(doc))


def test_model_with_no_layers_is_rejected() -> None:
    doc = tiny()
    doc["model"]["layers"] = []
    assert any(p.startswith("model.layers") for p in problems(doc))


def test_missing_profiles_for_a_layer_kind_are_rejected() -> None:
    doc = tiny()
    doc["profiles"] = doc["profiles"][:1]
    assert any("'b'" in p and "no profile row" in p for p in problems(doc))


def test_global_batch_that_cannot_be_split_is_rejected() -> None:
    doc = tiny()
    for row in doc["profiles"]:
        row["micro_batch"] = 2
    doc["job"]["global_batch_size"] = 3
    assert any(p.startswith("job.global_batch_size") and "multiple of 2" in p
               for p in problems(doc))


def test_duplicate_node_names_and_profile_points_are_rejected() -> None:
    doc = tiny()
    doc["cluster"]["nodes"][1]["name"] = "n0"
    doc["profiles"].append(dict(doc["profiles"][0]))
    found = problems(doc)
    assert any("duplicate node name" in p for p in found)
    assert any("duplicate profile point" in p for p in found)


def test_all_problems_are_reported_together() -> None:
    doc = tiny()
    doc["cluster"]["nodes"][0]["gpu_type"] = "X"
    doc["model"]["layers"].append("nope")
    assert len(problems(doc)) >= 2


def test_unknown_extension_fields_are_kept() -> None:
    doc = tiny()
    doc["x_source"] = {"who": "test"}
    assert parse_scenario(doc).model_extra == {"x_source": {"who": "test"}}
