"""The Megatron export, read by megatron-core itself: its TransformerConfig takes the
exported split, virtual-pipeline and recompute flags, its layer-offset and layers-to-build
functions give every pipeline stage (every virtual stage of an interleaved plan) the plan's
blocks, its RankGenerator puts every rank on the plan's GPU (TP groups, pipelines) and its
micro-batch calculator finds the plan's micro-batch count.

Megatron-LM copies its flags into TransformerConfig under other names
(`core_transformer_config_from_args`); FLAG_TO_CONFIG is that mapping.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest

torch = pytest.importorskip("torch")
with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # "Transformer Engine and Apex are not installed"
    pytest.importorskip("megatron.core")
    from megatron.core import parallel_state
    from megatron.core.num_microbatches_calculator import ConstantNumMicroBatchesCalculator
    from megatron.core.parallel_state import RankGenerator
    from megatron.core.transformer.enums import LayerType
    from megatron.core.transformer.transformer_block import get_num_layers_to_build
    from megatron.core.transformer.transformer_config import TransformerConfig
    from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

from planner import UnsupportedExport, parse_plan  # noqa: E402
from planner.documents import Plan  # noqa: E402
from planner.export import export_plan  # noqa: E402

FLAG_TO_CONFIG = {
    "--tensor-model-parallel-size": "tensor_model_parallel_size",
    "--pipeline-model-parallel-size": "pipeline_model_parallel_size",
    "--num-layers": "num_layers",
    "--decoder-first-pipeline-num-layers": "num_layers_in_first_pipeline_stage",
    "--decoder-last-pipeline-num-layers": "num_layers_in_last_pipeline_stage",
    "--pipeline-model-parallel-layout": "pipeline_model_parallel_layout",
    "--num-virtual-stages-per-pipeline-rank": "virtual_pipeline_model_parallel_size",
    "--recompute-granularity": "recompute_granularity",
    "--recompute-method": "recompute_method",
    "--recompute-num-layers": "recompute_num_layers",
}
# Megatron-LM's initialize_model_parallel order for each rank order of the export.
ORDERS = {"tp-dp-pp": "tp-cp-ep-dp-pp", "tp-pp-dp": "tp-cp-ep-pp-dp"}


def _plan(tp: int, splits: list[int], gpus: list[list[list[str]]], *, micro_batch_size: int = 2,
          num_micro_batches: int = 4) -> Plan:
    """Identical pipelines; stage s of pipeline p holds layers [splits[s], splits[s+1]) on
    gpus[p][s]."""
    return parse_plan({"pipelines": [
        {"micro_batch_size": micro_batch_size, "num_micro_batches": num_micro_batches,
         "stages": [{"gpu_type": "g", "tp": tp, "gpus": stage_gpus,
                     "layers": [splits[s], splits[s + 1]]}
                    for s, stage_gpus in enumerate(pipeline)]}
        for pipeline in gpus]})


def _node_gpus(node: str, first: int, count: int, tp: int) -> list[list[str]]:
    return [[f"{node}:{first + i * tp + k}" for k in range(tp)] for i in range(count)]


def _interleaved(plan: Plan, bounds: list[int], *, recompute: bool = False) -> Plan:
    """`plan` with its stages' layers replaced by model chunks [bounds[c], bounds[c+1]),
    chunk c on stage c % S, under interleaved-1f1b."""
    document = plan.model_dump(mode="json", exclude_none=True)
    for pipeline in document["pipelines"]:
        num_stages = len(pipeline["stages"])
        for s, stage in enumerate(pipeline["stages"]):
            stage.pop("layers", None)
            stage["chunks"] = [[bounds[c], bounds[c + 1]]
                               for c in range(s, len(bounds) - 1, num_stages)]
            stage["recompute"] = recompute
    return parse_plan(document | {"schedule": "interleaved-1f1b"})


# 10 layers: embedding, 8 blocks, head (one node of 8 GPUs unless said).
PLANS = {
    "tp2-pp2-dp2-even": _plan(2, [0, 5, 10], [
        [["a:0", "a:1"], ["a:4", "a:5"]], [["a:2", "a:3"], ["a:6", "a:7"]]]),
    "tp2-pp2-dp2-pipelines-fill-nodes": _plan(2, [0, 5, 10], [
        _node_gpus("a", 0, 2, 2), _node_gpus("b", 0, 2, 2)]),
    "pp4-first-last-counts": _plan(1, [0, 4, 6, 8, 10], [_node_gpus("a", 0, 4, 1)]),
    "pp3-embedding-and-head-alone": _plan(1, [0, 1, 9, 10], [_node_gpus("a", 0, 3, 1)]),
    "pp4-uneven-middles-dp2": _plan(1, [0, 3, 4, 7, 10], [
        _node_gpus("a", 0, 4, 1), _node_gpus("b", 0, 4, 1)], num_micro_batches=8),
    # Two blocks per model chunk (embedding and head ride along): the even virtual split.
    "vpp2-even-tp2-dp2-recompute": _interleaved(_plan(2, [0, 5, 10], [
        [["a:0", "a:1"], ["a:4", "a:5"]], [["a:2", "a:3"], ["a:6", "a:7"]]]),
        [0, 3, 5, 7, 10], recompute=True),
    # Uneven chunks, the embedding alone in chunk 0: only the layout says it.
    "vpp2-uneven-pp4": _interleaved(_plan(1, [0, 1, 2, 3, 10], [_node_gpus("a", 0, 4, 1)]),
                                    [0, 1, 2, 3, 4, 5, 7, 9, 10]),
    "pp2-recompute": _interleaved(_plan(1, [0, 5, 10], [_node_gpus("a", 0, 2, 1)]),
                                  [0, 5, 10], recompute=True),
}


def _flags(args: list[str]) -> dict[str, str | None]:
    """Megatron-LM arguments by flag; None for a switch."""
    flags: dict[str, str | None] = {}
    for i, arg in enumerate(args):
        if arg.startswith("--"):
            following = args[i + 1] if i + 1 < len(args) else "--"
            flags[arg] = None if following.startswith("--") else following
    return flags


def _config(args: list[str]) -> TransformerConfig:
    values: dict[str, Any] = {}
    for flag, value in _flags(args).items():
        if flag in FLAG_TO_CONFIG:
            assert value is not None
            values[FLAG_TO_CONFIG[flag]] = int(value) if value.isdigit() else value
    # cuda_graph_scope=[]: its default ("full") warns that it is deprecated.
    return TransformerConfig(hidden_size=64, num_attention_heads=4, pipeline_dtype=torch.float32,
                             cuda_graph_scope=[],
                             **values)


def _blocks_of_stage(config: TransformerConfig, pp_rank: int, vp_stage: int | None = None
                     ) -> tuple[int, int]:
    layout = config.pipeline_model_parallel_layout
    if layout is not None:  # its own functions take the rank; the config-level ones do not
        # They read vp_stage only where parallel_state says a virtual pipeline runs, as it
        # does in Megatron-LM once initialize_model_parallel has been given the size.
        parallel_state.set_virtual_pipeline_model_parallel_world_size(
            config.virtual_pipeline_model_parallel_size)
        try:
            offset = layout.get_layer_offset(layer_type=LayerType.decoder, pp_rank=pp_rank,
                                             vp_stage=vp_stage)
            count = layout.get_num_layers_to_build(layer_type=LayerType.decoder,
                                                   pp_rank=pp_rank, vp_stage=vp_stage)
        finally:
            parallel_state.set_virtual_pipeline_model_parallel_world_size(None)
    else:
        offset = get_transformer_layer_offset(config, pp_rank=pp_rank, vp_stage=vp_stage)
        count = get_num_layers_to_build(config, pp_rank=pp_rank, vp_stage=vp_stage)
    return offset, offset + count


def _gpu_of_rank(export: dict[str, Any]) -> dict[int, str]:
    gpus = {}
    for node in export["nodes"]:
        for i, device in enumerate(node["CUDA_VISIBLE_DEVICES"].split(",")):
            gpus[node["first_rank"] + i] = f"{node['node']}:{device}"
    return gpus


@pytest.mark.parametrize("name", sorted(PLANS))
def test_megatron_core_builds_each_stage_with_the_plans_blocks(name: str) -> None:
    plan = PLANS[name]
    export = export_plan(plan, "megatron")
    config = _config(export["args"])
    pipeline = plan.pipelines[0]
    vp = config.virtual_pipeline_model_parallel_size
    assert (vp or 1) == pipeline.stages[0].num_chunks
    # Blocks are layers 1..8, so block b is layer b + 1; stage s's chunk j is virtual stage j.
    expected = [[(max(start - 1, 0), min(end - 1, 8)) for start, end in s.ranges]
                for s in pipeline.stages]
    got = [[_blocks_of_stage(config, r, None if vp is None else j) for j in range(vp or 1)]
           for r in range(config.pipeline_model_parallel_size)]
    assert got == expected


@pytest.mark.parametrize("name", [n for n in sorted(PLANS) if "recompute" in n])
def test_recompute_makes_each_chunks_blocks_one_recomputed_unit(name: str) -> None:
    export = export_plan(PLANS[name], "megatron")
    config = _config(export["args"])  # TransformerConfig checks the recompute settings
    assert (config.recompute_granularity, config.recompute_method) == ("full", "uniform")
    # The uniform method recomputes units of recompute_num_layers blocks from the start of
    # each chunk's blocks: one unit per chunk keeps only the chunk's input, as planned.
    assert {n for n in export["blocks_per_chunk"] if n} == {config.recompute_num_layers}


def test_recompute_megatron_cannot_state_is_refused_with_the_reason() -> None:
    uneven = _interleaved(PLANS["pp2-recompute"], [0, 4, 10], recompute=True)  # 3 and 5 blocks
    with pytest.raises(UnsupportedExport, match=r"recompute with \[3, 5\] blocks per chunk"):
        export_plan(uneven, "megatron")
    partial = PLANS["pp2-recompute"].model_dump(mode="json", exclude_none=True)
    partial["pipelines"][0]["stages"][0]["recompute"] = False
    with pytest.raises(UnsupportedExport, match="recompute on some stages only"):
        export_plan(parse_plan(partial), "megatron")


def test_interleaving_megatron_cannot_run_is_refused_with_the_reason() -> None:
    one_stage = _interleaved(_plan(1, [0, 10], [_node_gpus("a", 0, 1, 1)]), [0, 5, 10])
    with pytest.raises(UnsupportedExport, match="interleaves model chunks across pipeline"):
        export_plan(one_stage, "megatron")
    odd = _interleaved(_plan(1, [0, 5, 10], [_node_gpus("a", 0, 2, 1)], num_micro_batches=3),
                       [0, 3, 5, 7, 10])
    with pytest.raises(UnsupportedExport, match="groups of pipeline_model_parallel_size"):
        export_plan(odd, "megatron")


@pytest.mark.parametrize("name", sorted(PLANS))
def test_megatron_core_rank_groups_put_every_rank_on_the_plans_gpu(name: str) -> None:
    plan = PLANS[name]
    export = export_plan(plan, "megatron")
    assert ("--use-tp-pp-dp-mapping" in export["args"]) == (export["rank_order"] == "tp-pp-dp")
    generator = RankGenerator(tp=export["tensor_model_parallel_size"], ep=1,
                              dp=export["data_parallel_size"],
                              pp=export["pipeline_model_parallel_size"], cp=1,
                              order=ORDERS[export["rank_order"]])
    gpu = _gpu_of_rank(export)
    tp_groups = {tuple(gpu[r] for r in group) for group in generator.get_ranks("tp")}
    assert tp_groups == {tuple(s.gpus) for p in plan.pipelines for s in p.stages}
    pp_groups = {tuple(gpu[r] for r in group) for group in generator.get_ranks("pp")}
    assert pp_groups == {tuple(s.gpus[k] for s in p.stages)
                         for p in plan.pipelines for k in range(p.stages[0].tp)}


@pytest.mark.parametrize("name", sorted(PLANS))
def test_megatron_core_finds_the_plans_micro_batch_count(name: str) -> None:
    plan = PLANS[name]
    flags = _flags(export_plan(plan, "megatron")["args"])
    calculator = ConstantNumMicroBatchesCalculator(
        int(flags["--global-batch-size"] or 0), int(flags["--micro-batch-size"] or 0),
        len(plan.pipelines), decrease_batch_size_if_needed=False, rank=0)
    assert calculator.get() == plan.pipelines[0].num_micro_batches


def test_layout_flag_puts_embedding_first_and_loss_last() -> None:
    export = export_plan(PLANS["pp3-embedding-and-head-alone"], "megatron")
    layout = _config(export["args"]).pipeline_model_parallel_layout
    stages = [stage[0] for stage in layout.layout]
    assert [s.count(LayerType.embedding) for s in stages] == [1, 0, 0]
    assert [s.count(LayerType.loss) for s in stages] == [0, 0, 1]
