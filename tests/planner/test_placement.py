"""Node-aligned placement, and the per-type choice's view of it."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from planner import evaluate, parse_scenario
from planner.search import per_type
from planner.search.assemble import PlacementStyle, place
from planner.search.drafts import realize, replicas_draft
from planner.search.tables import ScenarioTables, compile_tables
from planner.search.templates import TemplateContext, homogeneous_templates

SCENARIOS = Path(__file__).resolve().parent.parent / "data" / "scenarios"


@pytest.fixture(scope="module")
def tables() -> ScenarioTables:
    """Four types on nodes of 4 and 8 GPUs, with one or two network interfaces each."""
    document = json.loads((SCENARIOS / "l40sx16-a40x8-v32x16-t4x8-gpt2.7b.json").read_text())
    return compile_tables(parse_scenario(document))


def used_per_node(gpus: list[list[list[str]]]) -> Counter[str]:
    return Counter(g.rpartition(":")[0] for pipeline in gpus for stage in pipeline for g in stage)


def test_copies_that_fit_a_node_each_are_placed_one_node_each_and_run_faster(
        tables: ScenarioTables) -> None:
    """Two 7-stage V100 pipelines on two 8-GPU nodes with one interface each: packed, the
    second straddles both nodes and one node's interface serves 8 rings; aligned, each sits
    on a node of its own (7 GPUs used on each), and the plan is faster."""
    ctx = TemplateContext(tables, tables.scenario.job.schedule)
    (v100,) = [c for c in tables.classes if c.gpu_type.startswith("V100")]
    template = next(t for t in homogeneous_templates(ctx, v100)
                    if t.num_stages == 7 and t.stages[0].tp == 1)
    chosen = replicas_draft(tables, template, 2, "test")
    assert chosen is not None
    packed = place(tables, chosen.pipelines, PlacementStyle())
    aligned = place(tables, chosen.pipelines, PlacementStyle(aligned=True))
    assert packed is not None and aligned is not None
    assert sorted(used_per_node(packed).values()) == [6, 8]
    assert sorted(used_per_node(aligned).values()) == [7, 7]
    assert all(len({g.rpartition(":")[0] for stage in p for g in stage}) == 1 for p in aligned)
    by_style = {c.origin.rpartition(", ")[2]: evaluate(tables.scenario, c.plan)
                for c in realize(tables, chosen)}
    faster = by_style["node-aligned pipeline-major placement"]
    assert faster.iteration_s < by_style["pipeline-major placement"].iteration_s


def test_per_type_choice_sees_the_interface_share_and_no_straddle_of_aligned_copies(
        tables: ScenarioTables) -> None:
    """For every option of every class: where the choice counts an option's copies as
    node-aligned, placing them so gives every copy a node of its own and exactly the share
    of interfaces the choice assumed; the others are counted packed, every node whole."""
    ctx = TemplateContext(tables, tables.scenario.job.schedule)
    checked = 0
    for cls in tables.classes:
        options = per_type.class_options(ctx, cls)
        arrays = per_type._ClassArrays(tables, options)
        nics = {n.name: n.num_nics for n in cls.nodes}
        packed = min(min(1.0, n.num_nics / n.gpus) for n in cls.nodes)
        for k, option in enumerate(arrays.options):
            if arrays.stage_major[k]:
                continue  # `test_per_type_choice_times_stage_major_copies_as_so_placed`
            if not arrays.aligned[k]:
                assert arrays.share[k] == pytest.approx(packed)
                continue
            gpus = place(tables, [option.template] * option.copies,
                         PlacementStyle(aligned=True))
            assert gpus is not None
            assert all(len({g.rpartition(":")[0] for stage in p for g in stage}) == 1
                       for p in gpus)
            used = used_per_node(gpus)
            assert arrays.share[k] == pytest.approx(
                min(min(1.0, nics[node] / count) for node, count in used.items()))
            assert arrays.fill[k] == pytest.approx(option.template.fill_s)  # no straddle
            checked += 1
    assert checked > 20


def test_a_split_sized_for_sharded_state_is_offered_to_sets_of_as_few_pipelines_as_it_fits(
) -> None:
    """Under ZeRO the per-type choice offers splits sized for eight pipelines sharing their
    optimizer state; each is valid in a set of the fewest pipelines whose sharding lets its
    every stage fit (section 4), not only in sets of eight: it fits with that many, and with
    one fewer it does not."""
    from planner.search.partition import fixed_partition

    document = json.loads((SCENARIOS / "h200x8-h100x16-a80x16-llama13b.json").read_text())
    tables = compile_tables(parse_scenario(document))
    assert tables.scenario.job.zero_stage >= 1
    ctx = TemplateContext(tables, tables.scenario.job.schedule)

    def fits(template: object, n: int) -> bool:
        specs = [ctx.stage_spec(shape, template.micro_batch, template.num_stages - s, None)
                 for s, shape in enumerate(template.stages)][::-1]
        return fixed_partition(tables, specs, list(template.partition.bounds),
                               blocking=False, num_pipelines=n) is not None

    counts = Counter()
    for cls in tables.classes:
        for option in per_type.class_options(ctx, cls):
            n = option.min_pipelines
            assert fits(option.template, n)
            assert n == 1 or not fits(option.template, n - 1)
            counts[n] += 1
    assert any(1 < n < per_type.SHARDED_OVER for n in counts)


def test_per_type_choice_times_stage_major_copies_as_so_placed(tables: ScenarioTables) -> None:
    """Copies whose stages fit side by side in a node keep their rings inside it only when
    placed stage-major, and then every transfer crosses nodes; a copy at a time, their
    transfers stay as split and their rings cross nodes. The choice once counted both the
    inside rings and the transfers as split, a time no placement gives (1.1% fast on a
    held-out input, where it ranked that set first). Each of the two rows is timed as its
    placement, the quick estimate of the placed draft."""
    ctx = TemplateContext(tables, tables.scenario.job.schedule)
    batch = tables.scenario.job.global_batch_size
    checked = 0
    for cls in tables.classes:
        arrays = per_type._ClassArrays(tables, per_type.class_options(ctx, cls))
        ring = per_type._Ring(tables, [arrays])
        for k, option in enumerate(arrays.options):
            if not arrays.stage_major[k] or option.template.num_stages < 2:
                continue
            (twin,) = [j for j, o in enumerate(arrays.options) if o is option and j != k]
            chosen = replicas_draft(tables, option.template, option.copies, "test")
            assert chosen is not None
            quick = {c.origin.rpartition(", ")[2]: c.quick_s for c in realize(tables, chosen)}
            estimated = ring.iteration_s([arrays], (k,), batch)
            assert estimated == pytest.approx(quick["stage-major placement"], rel=2e-3)
            apart = ring.iteration_s([arrays], (twin,), batch)
            assert apart == pytest.approx(min(
                quick.get("node-aligned pipeline-major placement", float("inf")),
                quick["pipeline-major placement"]), rel=2e-3)
            checked += 1
    assert checked > 5


def test_per_type_choice_offers_each_set_once(tables: ScenarioTables) -> None:
    """Two rows of one option (a copy at a time, stage-major) pick the same pipelines: a set
    reached through both is drafted once (here one was offered twice, taking two of the
    places that judging gives the baseline's best candidates)."""
    ctx = TemplateContext(tables, tables.scenario.job.schedule)
    options = [per_type.class_options(ctx, cls) for cls in tables.classes]
    sets = list(per_type.per_type_choices(tables, options))
    assert len({tuple(id(o) for o in s.picks) for s in sets}) == len(sets) > 5
