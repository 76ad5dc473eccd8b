"""The per-type choices: homogeneous pipelines of each class, priced as they will be placed."""

from __future__ import annotations

from typing import Any

import pytest

from planner import parse_scenario
from planner.search import per_type
from planner.search.tables import compile_tables
from planner.search.templates import TemplateContext
from tests.planner.scenarios import uniform

# 1e6 bytes per sample at b = 1: 0.1 ms across nodes (10 GB/s), 0.01 ms inside one (100 GB/s);
# a stage beside a crossing pays the difference in its forward and again in its backward.
PER_CROSSING_S = 2 * (1e6 / 10e9 - 1e6 / 100e9)


def three_nodes_of_eight(**job: Any) -> Any:
    doc = uniform(**job)
    doc["model"]["layers"] = ["b"] * 12
    doc["gpu_types"]["G"]["memory_gib"] = 40
    doc["cluster"]["nodes"] = [{"name": f"n{i}", "gpu_type": "G", "gpus": 8} for i in range(3)]
    doc["job"]["global_batch_size"] = 48
    return parse_scenario(doc)


def options_by_depth(scenario: Any) -> dict[tuple[int, int], per_type.ClassOption]:
    tables = compile_tables(scenario)
    (cls,) = tables.classes
    found = per_type.class_options(TemplateContext(tables, scenario.job.schedule), cls)
    return {(o.template.num_stages, o.copies): o for o in found
            if o.template.micro_batch == 1 and o.template.stages[0].tp == 1}


def test_copies_that_start_mid_node_pay_for_the_crossing_their_template_did_not_price() -> None:
    scenario = three_nodes_of_eight()
    tables = compile_tables(scenario)
    options = options_by_depth(scenario)
    # 24 GPUs: eight copies of 3 stages start 0, 3, 6, 1, 4, 7, 2, 5 GPUs into a node; the
    # copy starting at 6 crosses between its stages 1 and 2, the one at 7 between 0 and 1.
    # The template's stages hold 4 equal layers each, the middle one heaviest (it has two
    # neighbours to send to): the copy starting at 6 puts a crossing beside it.
    three = options[(3, 8)]
    assert three.template.partition.bounds == (0, 4, 8, 12)
    assert three.template.bottleneck_s == three.template.partition.stage_s[1]
    # Six copies of 4 stages fill nodes exactly; one copy alone starts at a node.
    four, alone = options[(4, 6)], options[(3, 2)]
    lone = per_type.ClassOption(template=alone.template, copies=1)
    added = per_type._straddle_s(tables, [three, four, lone])
    assert added.tolist() == pytest.approx([PER_CROSSING_S, 0.0, 0.0])


def test_with_transfers_that_do_not_block_nothing_is_added() -> None:
    scenario = three_nodes_of_eight(blocking_transfers=False)
    options = options_by_depth(scenario)
    added = per_type._straddle_s(compile_tables(scenario), [options[(3, 8)]])
    assert added.tolist() == [0.0]
