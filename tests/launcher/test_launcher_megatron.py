"""The Megatron export, read by megatron-core itself: its TransformerConfig takes the
exported split flags, its layer-offset and layers-to-build functions give every pipeline
stage the plan's blocks, its RankGenerator puts every rank on the plan's GPU (TP groups,
pipelines) and its micro-batch calculator finds the plan's micro-batch count.

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
    from megatron.core.num_microbatches_calculator import ConstantNumMicroBatchesCalculator
    from megatron.core.parallel_state import RankGenerator
    from megatron.core.transformer.enums import LayerType
    from megatron.core.transformer.transformer_block import get_num_layers_to_build
    from megatron.core.transformer.transformer_config import TransformerConfig
    from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

from planner import parse_plan  # noqa: E402
from planner.documents import Plan  # noqa: E402
from planner.export import export_plan  # noqa: E402

FLAG_TO_CONFIG = {
    "--tensor-model-parallel-size": "tensor_model_parallel_size",
    "--pipeline-model-parallel-size": "pipeline_model_parallel_size",
    "--num-layers": "num_layers",
    "--decoder-first-pipeline-num-layers": "num_layers_in_first_pipeline_stage",
    "--decoder-last-pipeline-num-layers": "num_layers_in_last_pipeline_stage",
    "--pipeline-model-parallel-layout": "pipeline_model_parallel_layout",
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
            values[FLAG_TO_CONFIG[flag]] = value if "layout" in flag else int(value)
    # cuda_graph_scope=[]: its default ("full") warns that it is deprecated.
    return TransformerConfig(hidden_size=64, num_attention_heads=4, pipeline_dtype=torch.float32,
                             cuda_graph_scope=[],
                             **values)


def _blocks_of_stage(config: TransformerConfig, pp_rank: int) -> tuple[int, int]:
    layout = config.pipeline_model_parallel_layout
    if layout is not None:  # its own functions take the rank; the config-level ones do not
        offset = layout.get_layer_offset(layer_type=LayerType.decoder, pp_rank=pp_rank)
        count = layout.get_num_layers_to_build(layer_type=LayerType.decoder, pp_rank=pp_rank)
    else:
        offset = get_transformer_layer_offset(config, pp_rank=pp_rank)
        count = get_num_layers_to_build(config, pp_rank=pp_rank)
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
    # Blocks are layers 1..8, so block b is layer b + 1.
    expected = [(max(s.layers[0] - 1, 0), min(s.layers[1] - 1, 8)) for s in pipeline.stages]
    got = [_blocks_of_stage(config, r) for r in range(config.pipeline_model_parallel_size)]
    assert got == expected


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
