"""bench/exact_gap.py's measured and generated families: cuts of the shared scenarios that
keep what makes them hard (real profiles and links, the share of a GPU each layer needs)
at a size exact mode proves."""

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


@pytest.mark.parametrize(("family", "seed"), [(f, s) for f in ("measured", "generated")
                                               for s in range(8)])
def test_a_cut_is_a_node_or_two_per_type_within_exact_modes_limits(family: str,
                                                                   seed: int) -> None:
    doc = exact_gap.DRAWS[family](random.Random(seed))
    scenario = parse_scenario(doc)
    whole = next(json.loads(path.read_text()) for path in exact_gap.SETS[family]
                 if path.stem == doc["name"])
    types = [node.gpu_type for node in scenario.cluster.nodes]
    assert set(types) == {node["gpu_type"] for node in whole["cluster"]["nodes"]}
    assert len(set(types)) >= 2
    assert all(types.count(t) == 1 or {n.gpus for n in scenario.cluster.nodes
                                       if n.gpu_type == t} == {2} for t in set(types))
    assert scenario.cluster.num_gpus <= MAX_GPUS
    layers = scenario.model.layers
    assert 7 <= len(layers) <= min(MAX_LAYERS, 11)
    assert (layers[0], layers[1], layers[-1]) == tuple(
        whole["model"]["layers"][i] for i in (0, 1, -1))
    assert scenario.profiles == parse_scenario(whole).profiles
    fraction = len(layers) / len(whole["model"]["layers"])
    for name, gpu_type in scenario.gpu_types.items():
        reserved = scenario.reserved_gib(name)
        full = whole["gpu_types"][name]["memory_gib"]
        assert gpu_type.memory_gib - reserved == pytest.approx((full - reserved) * fraction)
