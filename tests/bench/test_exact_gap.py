"""bench/exact_gap.py's measured family: cuts that keep what makes the measured scenarios
hard (real profiles and links, the share of a GPU each layer needs) at a size exact mode
proves."""

from __future__ import annotations

import importlib
import json
import random
import sys
from pathlib import Path

import pytest

from planner import parse_scenario
from planner.search.exact import MAX_GPUS, MAX_LAYERS

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
exact_gap = importlib.import_module("exact_gap")  # bench/ scripts import as scripts


@pytest.mark.parametrize("seed", range(8))
def test_a_measured_cut_is_a_node_or_two_per_type_within_exact_modes_limits(seed: int) -> None:
    doc = exact_gap.measured_cut(random.Random(seed))
    scenario = parse_scenario(doc)
    whole = json.loads((ROOT / "bench" / "scenarios" / "measured" / f"{doc['name']}.json")
                       .read_text())
    types = [node.gpu_type for node in scenario.cluster.nodes]
    assert sorted(set(types)) == ["A100-40", "V100-16"]
    assert all(types.count(t) == 1 or {n.gpus for n in scenario.cluster.nodes
                                       if n.gpu_type == t} == {2} for t in set(types))
    assert scenario.cluster.num_gpus <= MAX_GPUS
    layers = scenario.model.layers
    assert 7 <= len(layers) <= min(MAX_LAYERS, 11)
    assert (layers[0], layers[1], layers[-1]) == tuple(
        whole["model"]["layers"][i] for i in (0, 1, -1))
    assert scenario.profiles == parse_scenario(whole).profiles
    reserved = whole["job"]["reserved_gib"]
    fraction = len(layers) / len(whole["model"]["layers"])
    for name, gpu_type in scenario.gpu_types.items():
        full = whole["gpu_types"][name]["memory_gib"]
        assert gpu_type.memory_gib - reserved == pytest.approx((full - reserved) * fraction)
