"""The torchtitan export, read by torchtitan itself (0.3 from PyPI): its ConfigManager
parses the exported flags into its own ParallelismConfig, TrainingConfig and activation
checkpointing policy, its ParallelDims accepts the degrees for the plan's world size, its
own stage split names modules as the export does, and its looped stage numbering gives
every rank of an interleaved plan the plan's chunks. torchtitan's model registries need
triton (absent with CPU torch), so the flags are parsed over a config of torchtitan's
sections alone."""

from __future__ import annotations

import dataclasses
import sys
import tomllib
import types
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("torchtitan")

from torchtitan.config.configs import ParallelismConfig, TrainingConfig  # noqa: E402
from torchtitan.config.manager import ConfigManager  # noqa: E402
from torchtitan.distributed.activation_checkpoint import (  # noqa: E402
    ActivationCheckpointingConfig,
    FullAC,
    SelectiveAC,
)
from torchtitan.distributed.parallel_dims import ParallelDims  # noqa: E402
from torchtitan.distributed.pipeline_parallel import (  # noqa: E402
    _generate_llm_fqn_per_model_part,
    _get_pp_rank_to_stage_indices_mapping,
)

from planner import UnsupportedExport, parse_plan  # noqa: E402
from planner.documents import Plan  # noqa: E402
from planner.export import export_plan  # noqa: E402

REGISTRY = "hetplan_torchtitan_sections"


@dataclasses.dataclass(kw_only=True)
class _Sections:
    """The part of torchtitan's Trainer.Config the export fills, plus what ConfigManager's
    own checks read."""

    hf_assets_path: str = "."
    parallelism: ParallelismConfig = dataclasses.field(default_factory=ParallelismConfig)
    training: TrainingConfig = dataclasses.field(default_factory=TrainingConfig)
    # As in torchtitan's Trainer.Config, selective unless the flags say otherwise.
    activation_checkpoint: ActivationCheckpointingConfig = dataclasses.field(
        default_factory=SelectiveAC.Config)


@pytest.fixture(autouse=True)
def _registry() -> Iterator[None]:
    """ConfigManager imports `--module` by name; a module of one config function."""
    module = types.ModuleType(REGISTRY)
    module.sections = _Sections  # type: ignore[attr-defined]
    sys.modules[REGISTRY] = module
    yield
    del sys.modules[REGISTRY]


def _parse(args: list[str]) -> Any:
    return ConfigManager().parse_args(["--module", REGISTRY, "--config", "sections", *args])


def _plan(tp: int, splits: list[int], num_pipelines: int, *, schedule: str | None = None,
          micro_batch_size: int = 2, num_micro_batches: int = 4) -> Plan:
    """Identical pipelines on node a, numbered as torchtitan's mesh numbers them (tp fastest,
    then pipeline, then stage)."""
    num_stages = len(splits) - 1

    def gpus(p: int, s: int) -> list[str]:
        first = tp * (p + num_pipelines * s)
        return [f"a:{first + k}" for k in range(tp)]

    return parse_plan({"schedule": schedule, "pipelines": [
        {"micro_batch_size": micro_batch_size, "num_micro_batches": num_micro_batches,
         "stages": [{"gpu_type": "g", "tp": tp, "gpus": gpus(p, s),
                     "layers": [splits[s], splits[s + 1]]} for s in range(num_stages)]}
        for p in range(num_pipelines)]})


def _interleaved(tp: int, bounds: list[int], num_stages: int, num_pipelines: int, *,
                 recompute: bool = False, num_micro_batches: int = 4) -> Plan:
    """As `_plan`, but model chunk c = [bounds[c], bounds[c+1]) on stage c % num_stages."""
    document = _plan(tp, bounds[: num_stages + 1], num_pipelines,
                     num_micro_batches=num_micro_batches).model_dump(mode="json",
                                                                    exclude_none=True)
    num_chunks = len(bounds) - 1
    for pipeline in document["pipelines"]:
        for s, stage in enumerate(pipeline["stages"]):
            del stage["layers"]
            stage["chunks"] = [[bounds[c], bounds[c + 1]]
                               for c in range(s, num_chunks, num_stages)]
            stage["recompute"] = recompute
    return parse_plan(document | {"schedule": "interleaved-1f1b"})


# 10 layers: embedding, 8 blocks, head.
PLANS = {
    "even-tp2-pp2-dp2": _plan(2, [0, 5, 10], 2),
    "uneven-pp3-gpipe": _plan(1, [0, 1, 8, 10], 1, schedule="gpipe"),
    "no-pipeline-dp4": _plan(1, [0, 10], 4, num_micro_batches=3),
    "interleaved-pp2-v2-dp2-recompute": _interleaved(1, [0, 3, 5, 8, 10], 2, 2, recompute=True),
    "interleaved-uneven-pp2-v3": _interleaved(2, [0, 1, 3, 5, 6, 8, 10], 2, 1,
                                              num_micro_batches=6),
}


@pytest.mark.parametrize("name", sorted(PLANS))
def test_torchtitan_config_manager_reads_the_exported_flags(name: str) -> None:
    plan = PLANS[name]
    export = export_plan(plan, "torchtitan")
    config = _parse(export["args"])
    for section, values in export["config"].items():
        for key, value in values.items():
            assert getattr(getattr(config, section), key) == value, f"{section}.{key}"
    world_size = sum(len(s.gpus) for p in plan.pipelines for s in p.stages)
    dims = ParallelDims.from_config(config.parallelism, world_size)
    assert (dims.pp, dims.dp_replicate, dims.tp) == (
        len(plan.pipelines[0].stages), len(plan.pipelines), plan.pipelines[0].stages[0].tp)


@pytest.mark.parametrize("name", sorted(PLANS))
def test_micro_batches_come_out_as_the_plan_has_them(name: str) -> None:
    plan = PLANS[name]
    config = _parse(export_plan(plan, "torchtitan")["args"])
    first = plan.pipelines[0]
    training, parallelism = config.training, config.parallelism
    accumulation = training.global_batch_size // (
        training.local_batch_size * parallelism.data_parallel_replicate_degree)
    if parallelism.pipeline_parallel_degree > 1:  # micro-batches of the pipeline schedule
        micro = training.local_batch_size // parallelism.pipeline_parallel_microbatch_size
        assert (micro, accumulation) == (first.num_micro_batches, 1)
        assert parallelism.pipeline_parallel_microbatch_size == first.micro_batch_size
    else:  # micro-batches become gradient accumulation
        assert (training.local_batch_size, accumulation) == (
            first.micro_batch_size, first.num_micro_batches)


@pytest.mark.parametrize("name", sorted(PLANS))
def test_activation_checkpointing_is_full_where_the_plan_recomputes_else_off(name: str) -> None:
    plan = PLANS[name]
    policy = _parse(export_plan(plan, "torchtitan")["args"]).activation_checkpoint
    recompute = plan.pipelines[0].stages[0].recompute
    assert isinstance(policy, FullAC.Config) if recompute else policy is None


@pytest.mark.parametrize("name", [n for n in sorted(PLANS) if "interleaved" in n])
def test_torchtitans_stage_numbering_gives_each_rank_the_plans_chunks(name: str) -> None:
    plan = PLANS[name]
    parallelism = _parse(export_plan(plan, "torchtitan")["args"]).parallelism
    assert parallelism.pipeline_parallel_schedule == "Interleaved1F1B"
    parts = parallelism.module_fqns_per_model_part
    pp = parallelism.pipeline_parallel_degree
    names = export_plan(plan, "pipelining")["layer_module_names"]
    for s, stage in enumerate(plan.pipelines[0].stages):
        held = _get_pp_rank_to_stage_indices_mapping(s, pp, "Interleaved1F1B", len(parts))
        assert [parts[i] for i in held] == [
            [n for layer in range(*chunk) for n in names[layer]] for chunk in stage.ranges]


def test_interleaved_plan_of_one_stage_or_partial_recompute_is_refused() -> None:
    single = _interleaved(1, [0, 5, 10], 1, 1)
    with pytest.raises(UnsupportedExport, match="pipeline_parallel_degree > 1"):
        export_plan(single, "torchtitan")
    document = PLANS["interleaved-pp2-v2-dp2-recompute"].model_dump(mode="json",
                                                                    exclude_none=True)
    document["pipelines"][0]["stages"][1]["recompute"] = False
    with pytest.raises(UnsupportedExport, match="recompute on some stages only"):
        export_plan(parse_plan(document), "torchtitan")


def test_local_learning_is_refused_with_the_reference_launcher_named() -> None:
    document = PLANS["even-tp2-pp2-dp2"].model_dump(mode="json", exclude_none=True)
    with pytest.raises(UnsupportedExport, match="no framework runs local learning"):
        export_plan(parse_plan(document | {"schedule": "local"}), "torchtitan")


def test_even_split_names_modules_as_torchtitans_own_split_does() -> None:
    export = export_plan(PLANS["even-tp2-pp2-dp2"], "torchtitan")
    assert export["config"]["parallelism"]["module_fqns_per_model_part"] == (
        _generate_llm_fqn_per_model_part(2, 8, input_weight=1, output_weight=1))


def test_uneven_split_gives_a_stage_the_embedding_alone() -> None:
    parallelism = export_plan(PLANS["uneven-pp3-gpipe"], "torchtitan")["config"]["parallelism"]
    assert parallelism["module_fqns_per_model_part"] == [
        ["tok_embeddings"], [f"layers.{i}" for i in range(7)], ["layers.7", "norm", "lm_head"]]
    assert parallelism["pipeline_parallel_schedule"] == "GPipe"


def test_toml_holds_the_flags_values_with_the_older_head_name() -> None:
    export = export_plan(PLANS["even-tp2-pp2-dp2"], "torchtitan")
    toml = tomllib.loads(export["toml"])
    fqns = export["config"]["parallelism"]["module_fqns_per_model_part"]
    older = [[{"lm_head": "output"}.get(name, name) for name in part] for part in fqns]
    assert toml["parallelism"] == export["config"]["parallelism"] | {
        "module_fqns_per_model_part": older}
    assert toml["training"] == export["config"]["training"]


def test_a_misspelt_flag_is_refused_by_torchtitan() -> None:
    with pytest.raises(SystemExit):
        _parse(["--parallelism.pipeline_parallel_degre", "2"])


def test_asymmetric_plan_is_refused_with_every_reason() -> None:
    plan = parse_plan({"pipelines": [
        {"micro_batch_size": 1, "num_micro_batches": 4, "stages": [
            {"gpu_type": "g", "tp": 2, "gpus": ["a:0", "a:1"], "layers": [0, 4]},
            {"gpu_type": "g", "tp": 1, "gpus": ["a:2"], "layers": [4, 10]}]},
        {"micro_batch_size": 2, "num_micro_batches": 2, "stages": [
            {"gpu_type": "g", "tp": 1, "gpus": ["b:0"], "layers": [0, 10]}]}]})
    with pytest.raises(UnsupportedExport) as caught:
        export_plan(plan, "torchtitan")
    text = "\n".join(caught.value.reasons)
    for expected in ("mixed TP degrees [1, 2]", "pipelines of different depths [2, 1]",
                     "mixed micro-batch sizes [1, 2]"):
        assert expected in text
