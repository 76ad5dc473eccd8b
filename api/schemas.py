"""Request and response bodies of the HTTP API, in families per resource
(`XCreate` in, `XPublic` out, `XsPublic{data, count}` for lists).

Input models forbid unknown fields (a typo such as `forward_s` must not be dropped
silently) and reject NaN, infinities and values beyond what any real measurement
reaches, with the same bounds as the planner's documents.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, model_validator

from planner.documents import MAX_BYTES, MAX_GB_PER_S, MAX_GIB, MAX_LATENCY_US, MAX_MS, Schedule

__all__ = [
    "NAME_PATTERN", "Name", "GpuTypeCreate", "GpuTypePublic", "ModelCreate", "ModelPublic", "ClusterCreate",
    "ClusterPublic", "ProfileRowIn", "ProfileCreate", "ProfileSetPublic", "ProfileRowPublic",
    "CoveragePublic", "LinkScope", "LinkIn", "LinksCreate", "LinkSetPublic", "StoredRef",
    "ScenarioSource", "PlanOptions", "PlanRequest", "EvaluateRequest", "PlanPublic",
    "PlanSummary", "JobPublic", "Page", "ErrorPublic",
]

T = TypeVar("T")

NAME_PATTERN = r"^[^\x00-\x1f]+$"
"""No control characters (PostgreSQL text cannot hold NUL; logs and headers need neither)."""

Name = Annotated[str, Field(min_length=1, max_length=200, pattern=NAME_PATTERN)]
"""Names of GPU types, models, clusters, nodes, kinds, zones: printable, at most 200."""


class _In(BaseModel):
    # strict: `false` is not 0.0 and `"1"` is not 1 (a JSON body says what it means); the
    # few fields whose JSON form is not their Python type (enums, tuples) opt out
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, frozen=True, strict=True)


class _Out(BaseModel):
    model_config = ConfigDict(frozen=True)


class Page(_Out, Generic[T]):
    data: list[T]
    count: int = Field(description="Items matching the query, over all pages.")


class ErrorProblem(_Out):
    path: str
    message: str
    value: Any = None


class ErrorPublic(_Out):
    """Every error answer: a stable code, a sentence saying what to change, the problems."""

    error: str
    message: str
    problems: list[ErrorProblem] = []


# -- GPU types, models, clusters --------------------------------------------------------

class GpuTypeCreate(_In):
    name: Name
    memory_gib: float = Field(gt=0, le=MAX_GIB, description="Usable memory per GPU, GiB.")
    peak_tflops: float | None = Field(default=None, gt=0, le=1e6)
    hourly_usd: float | None = Field(default=None, ge=0, le=1e6)
    reserved_gib: float | None = Field(default=None, ge=0, le=MAX_GIB,
                                       description="Overrides job.reserved_gib for this type.")


class _Versioned(_Out):
    id: int
    name: str
    version: int
    created_at: datetime


class GpuTypePublic(_Versioned):
    memory_gib: float
    peak_tflops: float | None = None
    hourly_usd: float | None = None
    reserved_gib: float | None = None


class LayerKindIn(_In):
    params: int = Field(ge=0, le=10**13)
    output_bytes_per_sample: float = Field(ge=0, le=MAX_BYTES)


class ModelCreate(_In):
    name: Name
    seq_len: int = Field(ge=1, le=10_000_000)
    layers: list[Name] = Field(min_length=1, max_length=100_000,
                               description="Layer kinds in order; indices are positions.")
    kinds: dict[Name, LayerKindIn] = Field(min_length=1, max_length=1000)

    @model_validator(mode="after")
    def _layers_name_known_kinds(self) -> ModelCreate:
        unknown = sorted({k for k in self.layers if k not in self.kinds})
        if unknown:
            raise ValueError(f"layers use kinds {unknown} that `kinds` does not declare; "
                             f"declare them or use one of {sorted(self.kinds)}")
        return self


class ModelPublic(_Versioned):
    seq_len: int
    layers: list[str]
    kinds: dict[str, LayerKindIn]


class NodeIn(_In):
    name: str = Field(min_length=1, max_length=200, pattern=r"^[^:\x00-\x1f]+$",
                      description="Unique in the cluster; no ':' (GPUs are named node:index).")
    gpu_type: Name
    gpus: int = Field(ge=1, le=1024)
    zone: Name | None = None
    nics: int | None = Field(default=None, ge=1, le=1024, description="Default: one per GPU.")


class LinkValue(_In):
    bandwidth_gb_per_s: float = Field(gt=0, le=MAX_GB_PER_S)
    latency_us: float = Field(default=0.0, ge=0, le=MAX_LATENCY_US)


class ZoneLinkValue(LinkValue):
    zones: tuple[Name, Name] = Field(strict=False)


class ClusterCreate(_In):
    """Nodes, and optionally the cluster's own links; without them, plans take links from
    the measured link catalogue (`POST /v1/links`)."""

    name: Name
    nodes: list[NodeIn] = Field(min_length=1, max_length=10_000)
    intra_node: dict[Name, LinkValue] | None = None
    inter_node: LinkValue | None = None
    inter_zone: list[ZoneLinkValue] | None = None

    @model_validator(mode="after")
    def _node_names_unique(self) -> ClusterCreate:
        names = [n.name for n in self.nodes]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"duplicate node names {duplicates}; node names must be unique")
        return self


class ClusterPublic(_Versioned):
    nodes: list[NodeIn]
    intra_node: dict[str, LinkValue] | None = None
    inter_node: LinkValue | None = None
    inter_zone: list[ZoneLinkValue] | None = None


# -- profiles ----------------------------------------------------------------------------

class ProfileRowIn(_In):
    """One measurement (docs/formats.md): one layer of `kind`, tensor-parallel
    degree `tp`, micro-batch `micro_batch`, times per micro-batch on each GPU of the group."""

    gpu_type: Name | None = Field(default=None, description="If given, must equal the "
                                  "upload's gpu_type (rows copied from a scenario carry it).")
    kind: Name
    micro_batch: int = Field(ge=1, le=1_000_000)
    tp: int = Field(ge=1, le=1024)
    forward_ms: float = Field(ge=0, le=MAX_MS)
    backward_ms: float = Field(ge=0, le=MAX_MS)
    activation_bytes: float = Field(ge=0, le=MAX_BYTES)


class ProfileCreate(_In):
    model: Name
    gpu_type: Name
    rows: list[ProfileRowIn] = Field(min_length=1, max_length=100_000)
    source: dict[str, Any] | None = Field(
        default=None, description="Free-form provenance: profiler, versions, host, date.")

    @model_validator(mode="after")
    def _rows_agree(self) -> ProfileCreate:
        problems = []
        seen: dict[tuple[str, int, int], int] = {}
        for i, row in enumerate(self.rows):
            if row.gpu_type is not None and row.gpu_type != self.gpu_type:
                problems.append(f"rows[{i}].gpu_type is {row.gpu_type!r} but the upload is for "
                                f"{self.gpu_type!r}; upload each GPU type separately")
            point = (row.kind, row.micro_batch, row.tp)
            if point in seen:
                problems.append(f"rows[{i}] repeats the point (kind, micro_batch, tp) = "
                                f"{list(point)} of rows[{seen[point]}]; keep one row per point")
            seen.setdefault(point, i)
        if problems:
            raise ValueError("; ".join(problems[:10]))
        return self


class ProfileRowPublic(_Out):
    model: str
    gpu_type: str
    version: int
    kind: str
    micro_batch: int
    tp: int
    forward_ms: float
    backward_ms: float
    activation_bytes: float
    uploaded: bool = Field(description="False: carried over unchanged from an earlier version.")


class ProfilePointPublic(_Out):
    kind: str
    micro_batch: int
    tp: int
    forward_ms: float
    backward_ms: float
    activation_bytes: float
    uploaded: bool


class ProfileSetPublic(_Out):
    id: int
    model: str
    gpu_type: str
    version: int
    count: int = Field(description="Rows in this version (uploaded plus carried over).")
    uploaded: int = Field(description="Rows in the upload that made this version.")
    replaced: int = Field(description="Points of the previous version this upload replaced.")
    source: dict[str, Any] | None = None
    created_at: datetime
    rows: list[ProfilePointPublic] | None = None


class CoverageEntry(_Out):
    model: str
    gpu_type: str
    version: int
    points: dict[str, list[tuple[int, int]]] = Field(
        description="Layer kind -> profiled (micro_batch, tp) points.")
    complete_points: list[tuple[int, int]] = Field(
        description="(micro_batch, tp) points profiled for every kind of the model (or of "
                    "the rows, when the model is not registered): the shapes a plan can use.")
    missing_kinds: list[str] = Field(
        description="Kinds of the registered model without any row on this GPU type.")


class CoveragePublic(_Out):
    data: list[CoverageEntry]


# -- links -------------------------------------------------------------------------------

class LinkScope(StrEnum):
    INTRA_NODE = "intra_node"
    INTER_NODE = "inter_node"
    INTER_ZONE = "inter_zone"


class LinkIn(_In):
    """A measured link: `intra_node` needs `gpu_type`, `inter_zone` needs `zones`."""

    scope: LinkScope = Field(strict=False)
    gpu_type: Name | None = None
    zones: tuple[Name, Name] | None = Field(default=None, strict=False)
    bandwidth_gb_per_s: float = Field(gt=0, le=MAX_GB_PER_S)
    latency_us: float = Field(ge=0, le=MAX_LATENCY_US)

    @model_validator(mode="after")
    def _scope_fields(self) -> LinkIn:
        if self.scope == LinkScope.INTRA_NODE and self.gpu_type is None:
            raise ValueError("an intra_node link needs gpu_type (links within one node of it)")
        if self.scope != LinkScope.INTRA_NODE and self.gpu_type is not None:
            raise ValueError(f"gpu_type only applies to intra_node links, not {self.scope}")
        if self.scope == LinkScope.INTER_ZONE and (self.zones is None
                                                   or self.zones[0] == self.zones[1]):
            raise ValueError("an inter_zone link needs zones: two different zone names")
        if self.scope != LinkScope.INTER_ZONE and self.zones is not None:
            raise ValueError(f"zones only apply to inter_zone links, not {self.scope}")
        return self


class LinksCreate(_In):
    links: list[LinkIn] = Field(min_length=1, max_length=10_000)

    @model_validator(mode="after")
    def _one_value_per_link(self) -> LinksCreate:
        seen: set[tuple[Any, ...]] = set()
        for i, link in enumerate(self.links):
            key = (link.scope, link.gpu_type, tuple(sorted(link.zones)) if link.zones else None)
            if key in seen:
                raise ValueError(f"links[{i}] repeats an earlier link of the same scope, GPU "
                                 "type and zones; keep one value per link")
            seen.add(key)
        return self


class LinkPublic(_Out):
    scope: LinkScope
    gpu_type: str | None = None
    zones: tuple[str, str] | None = None
    bandwidth_gb_per_s: float
    latency_us: float
    uploaded: bool


class LinkSetPublic(_Out):
    id: int
    version: int
    count: int
    uploaded: int
    replaced: int
    created_at: datetime
    links: list[LinkPublic]


# -- plans and evaluations ---------------------------------------------------------------

class StoredRef(_In):
    name: Name
    version: int | None = Field(default=None, ge=1, le=2**31 - 1,
                                description="Default: the newest.")


class JobIn(_In):
    """The `job` section of a scenario (docs/formats.md)."""

    global_batch_size: int = Field(ge=1, le=1_000_000)
    schedule: Literal["1f1b", "gpipe", "interleaved-1f1b", "local"] = Field(
        default="1f1b", description="The default schedule of the job's plans; `local` (local "
        "learning) changes what training computes and needs `local_head_kind`.")
    zero_stage: Literal[0, 1, 2] = 0
    param_bytes: float = Field(default=2, ge=0, le=64)
    grad_bytes: float = Field(default=4, ge=0, le=64)
    optimizer_bytes: float = Field(default=12, ge=0, le=256)
    reserved_gib: float = Field(default=2.0, ge=0, le=MAX_GIB)
    blocking_transfers: bool = True
    local_head_kind: Name | None = Field(
        default=None, description="Under schedule `local`: the model kind of the auxiliary "
        "head every stage but the last trains through (profiled like a layer kind).")


class ScenarioSource(_In):
    """Where the scenario comes from: a whole `scenario` document, or a stored or inline
    `cluster` and `model` with a `job`, completed from the stored GPU types, links and
    the newest (or pinned) profiles of the model on each GPU type of the cluster."""

    scenario: dict[str, Any] | None = Field(
        default=None, description="A whole hetplan-scenario/1 document (docs/formats.md).")
    cluster: Name | StoredRef | ClusterCreate | None = None
    model: Name | StoredRef | ModelCreate | None = None
    job: JobIn | None = None
    gpu_types: dict[Name, GpuTypeCreate] | None = Field(
        default=None, description="Override stored GPU types (the name field is ignored).")
    profile_versions: dict[Name, Annotated[int, Field(ge=1, le=2**31 - 1)]] | None = Field(
        default=None, description="GPU type -> profile version to use (default: newest).")
    links_version: int | None = Field(default=None, ge=1, le=2**31 - 1,
                                      description="Link catalogue version (default: newest).")


class PlanOptions(_In):
    time_limit_s: float | None = Field(
        default=None, gt=0, le=86_400,
        description="Budget of the search's time-limited steps (allocation, enumeration, "
        "polishing); building templates and baselines runs to the end whatever it is (about "
        "0.6 s + 0.3 ms per GPU + 2.5e-5 s per layer squared on 2 cores). Capped by the server's "
        "max_time_limit_s.")
    exact: bool = Field(default=False, description="Prove the optimum on small scenarios.")
    objective: Literal["throughput", "cost"] = Field(
        default="throughput", description="throughput: most samples/s; cost: least USD per "
        "million tokens. With a cost goal the answer may leave whole GPU types or nodes out "
        "(planned over sub-fleets; time_limit_s is then per sub-fleet).")
    max_usd_per_hour: float | None = Field(
        default=None, ge=0, le=1e9, description="Budget: USD/hour of the GPUs the plan uses.")
    min_samples_per_s: float | None = Field(
        default=None, ge=0, le=1e12, description="Floor: samples/s the plan must reach.")
    schedules: list[Annotated[Schedule, Field(strict=False)]] | None = Field(
        default=None, min_length=1, max_length=len(Schedule),
        description="Schedules the plan may use (default: the job's own). 'interleaved-1f1b' "
                    "lets the planner choose virtual stages; 'local' only for a job whose "
                    "schedule is 'local', and alone.")
    recompute: bool = Field(
        default=False, description="Let stages recompute activations where that lets a plan "
                                   "run larger micro-batches or fit at all.")
    max_local_blocks: int | None = Field(
        default=None, ge=1, le=1024,
        description="Under schedule 'local': the most blocks (stages) per pipeline.")
    launcher: Literal["megatron", "deepspeed", "torchtitan", "pipelining", "torchrun",
                      "kubernetes", "slurm"] | None = Field(
        default=None, description="Return the best plan this launcher format can run "
        "(Megatron-LM, DeepSpeed and torchtitan run one grid of identical pipelines).")


class PlanRequest(ScenarioSource):
    options: PlanOptions = PlanOptions()


class EvaluateRequest(ScenarioSource):
    plan: dict[str, Any] = Field(description="A hetplan-plan/1 document (docs/formats.md).")


class PlanSummary(_Out):
    id: str
    created_at: datetime
    status: str
    wall_s: float
    iteration_s: float | None = None
    samples_per_s: float | None = None
    usd_per_hour: float | None = Field(
        default=None, description="Price of the GPUs the plan uses; absent when a used GPU "
        "type has no hourly_usd.")


class EvaluationPublic(_Out):
    """The reference estimator's verdict on a plan (docs/formats.md); further fields
    (per-pipeline and per-stage numbers, shared interfaces, bounds) come as they are."""

    model_config = ConfigDict(frozen=True, extra="allow", json_schema_extra={"examples": [{
        "valid": True, "errors": [], "warnings": [], "schedule": "1f1b",
        "iteration_s": 1.234, "samples_per_s": 414.9, "tokens_per_s": 849715.0,
        "usd_per_hour": 46.4, "usd_per_million_tokens": 0.01517, "usd_per_iteration": 0.0159,
        "sync_s": 0.041, "pipelines": []}]})

    valid: bool
    errors: list[str] = Field(description="Every broken rule, naming pipeline, stage and values.")
    warnings: list[str] = []
    schedule: str | None = None
    iteration_s: float | None = None
    samples_per_s: float | None = None
    tokens_per_s: float | None = None
    usd_per_hour: float | None = Field(
        default=None, description="hourly_usd summed over the distinct GPUs the plan uses (idle "
        "ones can be handed back); null when a used GPU type has no price.")
    usd_per_million_tokens: float | None = None
    usd_per_iteration: float | None = None
    sync_s: float | None = None
    pipelines: list[dict[str, Any]] = []


class PlanPublic(_Out):
    id: str
    created_at: datetime
    status: str = Field(description="optimal, feasible or heuristic: whether it is proven.")
    wall_s: float
    plan: dict[str, Any] = Field(description="The hetplan-plan/1 document.")
    evaluation: EvaluationPublic
    unused_gpus: dict[str, str]
    sources: dict[str, Any] = Field(
        description="What the scenario was built from: stored names and versions (model, "
                    "cluster, GPU types, links, profiles), so the plan can be reproduced.")
    options: dict[str, Any]


class JobState(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


class JobKindName(StrEnum):
    PLAN = "plan"
    PARETO = "pareto"
    WHATIF = "whatif"


class JobPublic(_Out):
    id: str
    kind: JobKindName = Field(default=JobKindName.PLAN, description=(
        "What the job computes: `plan` (POST /v1/plans), `pareto` (POST /v1/plans/pareto), "
        "`whatif` (POST /v1/whatif)."))
    status: JobState
    progress: float = Field(ge=0, le=1)
    message: str
    plan_id: str | None = Field(default=None, description="A succeeded plan job's plan.")
    result: dict[str, Any] | None = Field(default=None, description=(
        "A succeeded pareto or what-if job's answer: the body the inline request answers "
        "with (its plans are stored: GET /v1/plans/{id})."))
    cancel_requested: bool
    error: dict[str, Any] | None = None
    attempts: int = Field(default=0, description=(
        "Times a worker started the job; more than 1 when a worker stopped while running "
        "it and another took it over."))
    created_at: datetime
    updated_at: datetime


class ExportFormat(StrEnum):
    TORCHRUN = "torchrun"
    PIPELINING = "pipelining"
    MEGATRON = "megatron"
    DEEPSPEED = "deepspeed"
    TORCHTITAN = "torchtitan"
    KUBERNETES = "kubernetes"
    SLURM = "slurm"


class ExportQuery(BaseModel):
    """Query parameters of GET /v1/plans/{id}/export: the options of `hetplan export`."""

    model_config = ConfigDict(extra="forbid")

    format: ExportFormat
    master_addr: str | None = Field(None, description="torchrun, deepspeed: rendezvous host.")
    master_port: int | None = Field(
        None, ge=1, le=65535, description="torchrun, deepspeed, kubernetes, slurm: rendezvous port.")
    training_module: str | None = Field(
        None, description="torchrun, deepspeed, kubernetes, slurm: the module the launcher starts.")
    plan_path: str | None = Field(None, description="Path of the plan on the nodes.")
    script_arg: list[str] | None = Field(
        None, description="An argument for the training module; repeat, in order.")
    zero_stage: int | None = Field(None, description="deepspeed: ZeRO stage.")
    name: str | None = Field(None, description="kubernetes, slurm: job name.")
    image: str | None = Field(None, description="kubernetes: container image.")
    gpu_name: list[str] | None = Field(
        None, description="kubernetes, slurm: TYPE=NAME, what the cluster calls a GPU type "
                          "(node label or feature); repeat per type.")

    def options(self) -> dict[str, Any]:
        """The options given, under the names `planner.export.export_plan` takes."""
        from planner.export import parse_gpu_names

        given = {"master_addr": self.master_addr, "master_port": self.master_port,
                 "training_module": self.training_module, "plan_path": self.plan_path,
                 "script_args": self.script_arg, "zero_stage": self.zero_stage,
                 "name": self.name, "image": self.image,
                 "gpu_names": None if self.gpu_name is None else parse_gpu_names(self.gpu_name)}
        return {key: value for key, value in given.items() if value is not None}
