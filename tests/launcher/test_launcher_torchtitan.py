"""The torchtitan export, read by torchtitan itself (0.3 from PyPI): its ConfigManager
parses the exported flags into its own ParallelismConfig and TrainingConfig, its
ParallelDims accepts the degrees for the plan's world size, and its own stage split names
modules as the export does. torchtitan's model registries need triton (absent with CPU
torch), so the flags are parsed over a config of torchtitan's sections alone."""

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
from torchtitan.distributed.parallel_dims import ParallelDims  # noqa: E402
from torchtitan.distributed.pipeline_parallel import (  # noqa: E402
    _generate_llm_fqn_per_model_part,
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


# 10 layers: embedding, 8 blocks, head.
PLANS = {
    "even-tp2-pp2-dp2": _plan(2, [0, 5, 10], 2),
    "uneven-pp3-gpipe": _plan(1, [0, 1, 8, 10], 1, schedule="gpipe"),
    "no-pipeline-dp4": _plan(1, [0, 10], 4, num_micro_batches=3),
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
