"""Scenario and plan documents of docs/formats.md (versions 1 and 1.1), as typed models.

Parsing goes through `parse_scenario` / `parse_plan`, which turn every
structural and cross-reference problem into one `InvalidScenario` /
`InvalidPlan` listing field paths, values and what to change. Unknown fields
are kept (extensions such as `x_sailor` travel with the document).
"""

from __future__ import annotations

import math
from collections import Counter
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from planner.errors import InvalidPlan, InvalidScenario, Problem

__all__ = [
    "SCENARIO_FORMAT",
    "PLAN_FORMAT",
    "Schedule",
    "GpuType",
    "Node",
    "Link",
    "ZoneLink",
    "Cluster",
    "LayerKind",
    "Model",
    "ProfileRow",
    "Job",
    "Scenario",
    "LayerRange",
    "Stage",
    "Pipeline",
    "Plan",
    "parse_scenario",
    "parse_plan",
    "scenario_problems",
    "dump_document",
]

SCENARIO_FORMAT: Literal["hetplan-scenario/1"] = "hetplan-scenario/1"
PLAN_FORMAT: Literal["hetplan-plan/1"] = "hetplan-plan/1"

# Bounds that no real measurement reaches: a value beyond them is a unit mistake.
MAX_MS = 3.6e6  # one hour for one layer and one micro-batch
MAX_BYTES = 2.0**50  # a pebibyte
MAX_GIB = 1.0e5
MAX_GB_PER_S = 1.0e5
MAX_LATENCY_US = 1.0e8


class Schedule(StrEnum):
    ONE_F_ONE_B = "1f1b"
    GPIPE = "gpipe"
    INTERLEAVED_1F1B = "interleaved-1f1b"
    """Megatron's interleaved 1F1B: every stage holds `v` chunks of layers (virtual stages)."""
    LOCAL = "local"
    """Local learning (PPLL): every stage but the last trains on its own loss through a head;
    no gradient crosses a stage boundary, so training differs from end-to-end backprop."""


class _Document(BaseModel):
    model_config = ConfigDict(frozen=True, extra="allow", allow_inf_nan=False)


Ms = Annotated[float, Field(ge=0, le=MAX_MS)]
Bytes = Annotated[float, Field(ge=0, le=MAX_BYTES)]
Count = Annotated[int, Field(ge=1, le=1_000_000)]


class GpuType(_Document):
    memory_gib: float = Field(gt=0, le=MAX_GIB, description="Usable memory per GPU, GiB.")
    peak_tflops: float | None = Field(default=None, gt=0, le=1e6)
    hourly_usd: float | None = Field(default=None, ge=0, le=1e6)
    reserved_gib: float | None = Field(
        default=None, ge=0, le=MAX_GIB, description="Overrides job.reserved_gib for this type."
    )


class Node(_Document):
    name: str = Field(min_length=1, max_length=200)
    gpu_type: str = Field(min_length=1)
    gpus: int = Field(ge=1, le=1024, description="GPUs on the node; at least 1.")
    zone: str | None = None
    nics: int | None = Field(default=None, ge=1, le=1024, description="Default: one per GPU.")

    @property
    def num_nics(self) -> int:
        return self.gpus if self.nics is None else self.nics


class Link(_Document):
    bandwidth_gb_per_s: float = Field(gt=0, le=MAX_GB_PER_S)
    latency_us: float = Field(default=0.0, ge=0, le=MAX_LATENCY_US)


class ZoneLink(Link):
    zones: tuple[str, str]


class Cluster(_Document):
    nodes: list[Node] = Field(min_length=1)
    intra_node: dict[str, Link] = Field(default_factory=dict)
    inter_node: Link
    inter_zone: list[ZoneLink] = Field(default_factory=list)

    @property
    def num_gpus(self) -> int:
        """GPUs on all nodes, used or not."""
        return sum(node.gpus for node in self.nodes)

    @property
    def gpus_per_type(self) -> Counter[str]:
        """GPUs on all nodes by GPU type, in the order the types first appear."""
        gpus = Counter[str]()
        for node in self.nodes:
            gpus[node.gpu_type] += node.gpus
        return gpus


class LayerKind(_Document):
    params: int = Field(ge=0, le=10**13)
    output_bytes_per_sample: Bytes


class Model(_Document):
    name: str = "model"
    seq_len: Count
    layers: list[str] = Field(min_length=1)
    kinds: dict[str, LayerKind] = Field(min_length=1)


class ProfileRow(_Document):
    gpu_type: str
    kind: str
    micro_batch: Count
    tp: Count
    forward_ms: Ms
    backward_ms: Ms
    activation_bytes: Bytes


class Job(_Document):
    global_batch_size: Count
    schedule: Schedule = Schedule.ONE_F_ONE_B
    zero_stage: Literal[0, 1, 2] = 0
    param_bytes: float = Field(default=2, ge=0, le=64)
    grad_bytes: float = Field(default=4, ge=0, le=64)
    optimizer_bytes: float = Field(default=12, ge=0, le=256)
    reserved_gib: float = Field(default=2.0, ge=0, le=MAX_GIB)
    blocking_transfers: bool = True
    local_head_kind: str | None = Field(
        default=None, min_length=1,
        description="The kind (of model.kinds, in no position of model.layers) of the auxiliary "
                    "head every stage but the last trains through under schedule local.")


class Scenario(_Document):
    format: Literal["hetplan-scenario/1"] = SCENARIO_FORMAT
    gpu_types: dict[str, GpuType] = Field(min_length=1)
    cluster: Cluster
    model: Model
    profiles: list[ProfileRow] = Field(min_length=1)
    job: Job

    def reserved_gib(self, gpu_type: str) -> float:
        own = self.gpu_types[gpu_type].reserved_gib
        return self.job.reserved_gib if own is None else own


LayerRange = tuple[int, int]
"""Half-open range of layer indices [start, end)."""


class Stage(_Document):
    """One stage of a pipeline. Its layers are one range (`layers`, read back as
    `stage.layers`) or, under interleaved-1f1b, several `chunks`; `stage.ranges` gives
    either as a list. `recompute` stages keep only each micro-batch's input and run the
    forward again before the backward."""

    model_config = ConfigDict(validate_by_name=True, validate_by_alias=True,
                              serialize_by_alias=True)

    gpu_type: str
    tp: int
    gpus: list[str]
    single_range: LayerRange | None = Field(default=None, alias="layers")
    chunks: list[LayerRange] | None = Field(default=None, min_length=1)
    recompute: bool = Field(default=False, exclude_if=lambda recompute: not recompute)
    """Written only when true, so version-1 plans serialise as they always did."""

    @model_validator(mode="after")
    def _layers_or_chunks(self) -> Stage:
        if (self.single_range is None) == (self.chunks is None):
            raise ValueError("a stage has either `layers` (one range) or `chunks` (several "
                             "ranges, interleaved-1f1b), not both and not neither")
        return self

    @property
    def layers(self) -> LayerRange:
        """The stage's one layer range; a stage of several chunks has none, and code that
        reads one range per stage must not guess."""
        if self.single_range is not None:
            return self.single_range
        assert self.chunks is not None, "validated: layers or chunks"
        if len(self.chunks) == 1:
            return self.chunks[0]
        raise InvalidPlan([Problem(
            path="stages[].chunks", value=[list(c) for c in self.chunks],
            message="this stage holds several layer chunks (interleaved-1f1b) and this step "
                    "handles one layer range per stage; use a plan without chunks here")])

    @property
    def ranges(self) -> list[LayerRange]:
        """The stage's layer ranges: its chunks in order, or its one range."""
        if self.chunks is not None:
            return list(self.chunks)
        assert self.single_range is not None, "validated: layers or chunks"
        return [self.single_range]

    @property
    def num_chunks(self) -> int:
        return 1 if self.chunks is None else len(self.chunks)


class Pipeline(_Document):
    micro_batch_size: int
    num_micro_batches: int
    stages: list[Stage] = Field(min_length=1)


class Plan(_Document):
    format: Literal["hetplan-plan/1"] = PLAN_FORMAT
    schedule: Schedule | None = None
    pipelines: list[Pipeline] = Field(min_length=1)
    estimate: dict[str, Any] | None = None


def _path(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(document)"


def _problems_from(error: ValidationError) -> list[Problem]:
    problems = []
    for item in error.errors(include_url=False):
        value = item.get("input")
        if isinstance(value, dict | list):
            value = None  # the whole sub-document is noise in a message
        problems.append(Problem(path=_path(item["loc"]), message=item["msg"], value=value))
    return problems


def parse_scenario(document: Any) -> Scenario:
    """A validated `Scenario` from a decoded JSON/YAML document, or `InvalidScenario`."""
    if isinstance(document, Scenario):
        scenario = document
    else:
        try:
            scenario = Scenario.model_validate(document)
        except ValidationError as error:
            raise InvalidScenario(_problems_from(error)) from None
    problems = scenario_problems(scenario)
    if problems:
        raise InvalidScenario(problems)
    return scenario


def parse_plan(document: Any) -> Plan:
    """A structurally sound `Plan`; its validity against a scenario is `evaluate`'s job."""
    if isinstance(document, Plan):
        return document
    try:
        return Plan.model_validate(document)
    except ValidationError as error:
        raise InvalidPlan(_problems_from(error)) from None


def scenario_problems(scenario: Scenario) -> list[Problem]:
    """Cross-reference problems that field types alone cannot catch."""
    return [
        *_cluster_problems(scenario),
        *_model_problems(scenario),
        *_local_head_problems(scenario),
        *_profile_problems(scenario),
    ]


def _cluster_problems(scenario: Scenario) -> list[Problem]:
    known = sorted(scenario.gpu_types)
    problems = []
    seen: set[str] = set()
    for i, node in enumerate(scenario.cluster.nodes):
        if node.gpu_type not in scenario.gpu_types:
            problems.append(Problem(
                path=f"cluster.nodes[{i}].gpu_type", value=node.gpu_type,
                message=f"unknown GPU type; declare it in gpu_types or use one of {known}"))
        if node.name in seen:
            problems.append(Problem(path=f"cluster.nodes[{i}].name", value=node.name,
                                    message="duplicate node name; node names must be unique"))
        if ":" in node.name:
            problems.append(Problem(path=f"cluster.nodes[{i}].name", value=node.name,
                                    message="node names may not contain ':' (GPUs are 'node:index')"))
        seen.add(node.name)
    used = {n.gpu_type for n in scenario.cluster.nodes}
    for gpu_type in sorted(used - set(scenario.cluster.intra_node)):
        if gpu_type in scenario.gpu_types:
            problems.append(Problem(
                path=f"cluster.intra_node.{gpu_type}",
                message="missing intra-node link for a GPU type that nodes use; add "
                        "{bandwidth_gb_per_s, latency_us} for it"))
    return problems


def _model_problems(scenario: Scenario) -> list[Problem]:
    model = scenario.model
    problems = []
    for i, kind in enumerate(model.layers):
        if kind not in model.kinds:
            problems.append(Problem(
                path=f"model.layers[{i}]", value=kind,
                message=f"unknown layer kind; declare it in model.kinds ({sorted(model.kinds)})"))
    return problems


def _local_head_problems(scenario: Scenario) -> list[Problem]:
    job, model = scenario.job, scenario.model
    head = job.local_head_kind
    if head is None:
        if job.schedule is Schedule.LOCAL:
            return [Problem(path="job.local_head_kind",
                            message="schedule 'local' trains every stage but the last through an "
                                    "auxiliary head; name its kind (declared in model.kinds)")]
        return []
    if head not in model.kinds:
        return [Problem(path="job.local_head_kind", value=head,
                        message=f"unknown layer kind; declare it in model.kinds ({sorted(model.kinds)})")]
    if head in model.layers:
        return [Problem(path="job.local_head_kind", value=head,
                        message="the head kind is also a layer of model.layers; give the head a "
                                "kind of its own")]
    return []


def _profile_problems(scenario: Scenario) -> list[Problem]:
    problems = []
    seen: set[tuple[str, str, int, int]] = set()
    for i, row in enumerate(scenario.profiles):
        if row.gpu_type not in scenario.gpu_types:
            problems.append(Problem(path=f"profiles[{i}].gpu_type", value=row.gpu_type,
                                    message="profile for an unknown GPU type"))
        if row.kind not in scenario.model.kinds:
            problems.append(Problem(path=f"profiles[{i}].kind", value=row.kind,
                                    message="profile for a layer kind the model does not declare"))
        point = (row.gpu_type, row.kind, row.micro_batch, row.tp)
        if point in seen:
            problems.append(Problem(
                path=f"profiles[{i}]", value=list(point),
                message="duplicate profile point (gpu_type, kind, micro_batch, tp); keep one row"))
        seen.add(point)
    used_kinds = set(scenario.model.layers)
    profiled_kinds = {row.kind for row in scenario.profiles}
    for kind in sorted(used_kinds - profiled_kinds):
        problems.append(Problem(path="profiles", value=kind,
                                message=f"no profile row for layer kind {kind!r} on any GPU type; "
                                        "upload at least one"))
    if not problems:
        problems.extend(_batch_problems(scenario))
    return problems


def _batch_problems(scenario: Scenario) -> list[Problem]:
    """The global batch must be expressible as a sum of usable micro-batch sizes."""
    kinds = set(scenario.model.layers)
    kinds_at: dict[int, set[str]] = {}
    for row in scenario.profiles:
        kinds_at.setdefault(row.micro_batch, set()).add(row.kind)
    usable = sorted(b for b, profiled in kinds_at.items() if kinds <= profiled)
    batch = scenario.job.global_batch_size
    if not usable:
        return [Problem(path="profiles", message="no micro-batch size has a row for every layer "
                        f"kind {sorted(kinds)}; profile all kinds at one micro-batch size at least")]
    fitting = [b for b in usable if b <= batch]
    if not fitting or batch % math.gcd(*fitting) != 0:
        return [Problem(path="job.global_batch_size", value=batch,
                        message=f"cannot be split into micro-batches of the profiled sizes "
                                f"{usable}; use a multiple of {math.gcd(*fitting or usable)}")]
    return []


def dump_document(document: BaseModel) -> dict[str, Any]:
    """JSON-ready dict of a document, without the optional fields left unset."""
    return document.model_dump(mode="json", exclude_none=True)
