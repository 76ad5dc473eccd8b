"""Plans written for the launchers people run: torchrun, Megatron-LM and DeepSpeed
(torch.distributed.pipelining in `planner.export.pipelining`, torchtitan in
`planner.export.torchtitan`).

Every export starts from the rank map (`planner.export.ranks`), so the ranks a
format's launcher creates are the ranks the plan means. A format that cannot
express something the plan uses raises `UnsupportedExport` listing every such
thing at once, so one reading tells what to change in the plan.

Layer kinds: a plan names layers by index only. Exports that name modules
(Megatron's layout, pipelining's module names) take `layer_kinds`; by default
layer 0 is the embedding, the last layer the head, and the others blocks, as in
every hetplan scenario.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Sequence
from typing import Any

from planner.documents import LayerRange, Plan, Schedule
from planner.errors import UnsupportedExport
from planner.export.ranks import RankMap, build_rank_map
from planner.schedules import model_chunks

__all__ = [
    "DEFAULT_MASTER_PORT",
    "torchrun_argv",
    "export_torchrun",
    "export_megatron",
    "export_deepspeed",
]

DEFAULT_MASTER_PORT = 29500
EMBEDDING, BLOCK, HEAD = "embedding", "block", "head"

LOCAL_REASON = ("schedule 'local' (local learning); no framework runs local learning: run "
                "the plan with the reference launcher (hetplan launch, or the torchrun export "
                "with launcher.train)")


def _schedule(plan: Plan, job_schedule: str | None) -> Schedule:
    """The schedule the plan runs: its own, else the scenario job's (`job_schedule`), else the
    job default, 1f1b (docs/formats.md: a plan without one runs the job's)."""
    if plan.schedule is not None:
        return plan.schedule
    if job_schedule is None:
        return Schedule.ONE_F_ONE_B
    try:
        return Schedule(job_schedule)
    except ValueError:
        raise ValueError(f"job_schedule {job_schedule!r}; use one of "
                         f"{[s.value for s in Schedule]}") from None


def _schedule_notes(plan: Plan, job_schedule: str | None) -> list[str]:
    if plan.schedule is None and job_schedule is None:
        return ["The plan names no schedule and no job_schedule was given: assumed 1f1b, the "
                "job default. Pass the scenario (job.schedule) if it says otherwise."]
    return []


def _kinds(num_layers: int, layer_kinds: Sequence[str] | None) -> list[str]:
    if layer_kinds is None:
        if num_layers < 2:
            return [BLOCK] * num_layers
        return [EMBEDDING, *([BLOCK] * (num_layers - 2)), HEAD]
    if len(layer_kinds) != num_layers:
        raise ValueError(
            f"layer_kinds has {len(layer_kinds)} entries but the plan has {num_layers} layers; "
            "pass the scenario's model.layers"
        )
    return list(layer_kinds)


# ---------------------------------------------------------------- torchrun


def torchrun_argv(*, num_nodes: int, nproc_per_node: int, node_rank: str, master_addr: str,
                  master_port: str, training_module: str, plan_path: str,
                  script_args: Sequence[str]) -> list[str]:
    """One node's torchrun command. Static rendezvous (`--node-rank`) is what makes torchrun's
    global ranks equal the rank map's: a c10d rendezvous would number nodes in arrival order.
    Node rank, address and port are strings so cluster exports can pass shell variables."""
    return [
        "torchrun", f"--nnodes={num_nodes}", f"--nproc-per-node={nproc_per_node}",
        f"--node-rank={node_rank}", "--rdzv-backend=static",
        f"--master-addr={master_addr}", f"--master-port={master_port}",
        "-m", training_module, "--plan", plan_path, *script_args,
    ]


def export_torchrun(
    plan: Plan,
    *,
    master_addr: str | None = None,
    master_port: int = DEFAULT_MASTER_PORT,
    training_module: str = "launcher.train",
    plan_path: str = "plan.json",
    script_args: Sequence[str] = (),
) -> dict[str, Any]:
    """One `torchrun` command per node (see `torchrun_argv`)."""
    ranks = build_rank_map(plan)
    addr = master_addr or ranks.nodes[0].name
    commands = []
    for node in ranks.nodes:
        visible = ",".join(str(i) for i in node.device_indices)
        argv = torchrun_argv(
            num_nodes=len(ranks.nodes), nproc_per_node=node.num_processes,
            node_rank=str(node.node_rank), master_addr=addr, master_port=str(master_port),
            training_module=training_module, plan_path=plan_path, script_args=script_args)
        commands.append({
            "node": node.name, "node_rank": node.node_rank, "nproc_per_node": node.num_processes,
            "first_rank": node.first_rank, "env": {"CUDA_VISIBLE_DEVICES": visible},
            "argv": argv, "command": f"CUDA_VISIBLE_DEVICES={visible} " + shlex.join(argv),
        })
    return {
        "format": "torchrun",
        "world_size": ranks.world_size,
        "master_addr": addr,
        "master_port": master_port,
        "nodes": commands,
        "notes": [
            "Run each command on its node. CUDA_VISIBLE_DEVICES lists the plan's GPUs of the "
            "node in local-rank order, so local rank k uses cuda:k.",
            "Nodes may run different numbers of processes; torchrun numbers ranks node by "
            "node in --node-rank order, which is the rank map's order.",
        ],
    }


# ---------------------------------------------------------------- module names


# The LM head's module name in torchtitan's decoder: `lm_head` from torchtitan 0.3, `output`
# before (the releases that read TOML configs).
LM_HEAD, LM_HEAD_BEFORE_0_3 = "lm_head", "output"


def _torchtitan_names(kinds: Sequence[str], layers: tuple[int, int], *, head: str = LM_HEAD
                      ) -> list[str]:
    """Module names in torchtitan's decoder (tok_embeddings, layers.<block>, norm, `head`)."""
    names, block = [], sum(1 for kind in kinds[: layers[0]] if kind == BLOCK)
    for kind in kinds[layers[0]: layers[1]]:
        if kind == EMBEDDING:
            names.append("tok_embeddings")
        elif kind == HEAD:
            names.extend(["norm", head])
        else:
            names.append(f"layers.{block}")
            block += 1
    return names


# ---------------------------------------------------------------- Megatron / DeepSpeed


def _chunks_per_stage(plan: Plan) -> int:
    return max(p.stages[0].num_chunks for p in plan.pipelines)


def _effective_schedule(plan: Plan, schedule: Schedule) -> Schedule:
    """An interleaved plan whose stages all hold one range runs plain 1F1B (section 6 of the
    cost model, and the estimator, say so)."""
    if schedule is Schedule.INTERLEAVED_1F1B and _chunks_per_stage(plan) == 1:
        return Schedule.ONE_F_ONE_B
    return schedule


def _schedule_reasons(plan: Plan, fmt: str, schedule: Schedule,
                      schedules: Sequence[Schedule]) -> list[str]:
    effective = _effective_schedule(plan, schedule)
    if effective is Schedule.LOCAL:
        return [LOCAL_REASON]
    if effective in schedules:
        return []
    what = (f" with {_chunks_per_stage(plan)} chunks per stage"
            if effective is Schedule.INTERLEAVED_1F1B else "")
    return [f"schedule {effective.value!r}{what}; {fmt}'s pipeline engine runs "
            f"{' or '.join(s.value for s in schedules)}"
            + ("" if Schedule.INTERLEAVED_1F1B in schedules or not what
               else " (one layer range per stage, no interleaving)")]


def _uniform_reasons(plan: Plan, fmt: str, schedule: Schedule,
                     schedules: Sequence[Schedule] = (Schedule.ONE_F_ONE_B,)) -> list[str]:
    """What a plan uses that a framework with one (TP, PP, DP) grid running `schedules`
    lacks."""
    reasons = []
    tps = sorted({s.tp for p in plan.pipelines for s in p.stages})
    if len(tps) > 1:
        reasons.append(f"mixed TP degrees {tps}; {fmt} uses one TP degree for every stage")
    depths = [len(p.stages) for p in plan.pipelines]
    if len(set(depths)) > 1:
        reasons.append(f"pipelines of different depths {depths}; {fmt} uses one PP degree")
    chunks = [p.stages[0].num_chunks for p in plan.pipelines]
    if len(set(chunks)) > 1:
        reasons.append(f"pipelines of different chunks per stage {chunks}; {fmt}'s "
                       "data-parallel replicas all split the model the same way")
    # Where model chunks 1.. begin: the stage boundaries when every stage holds one range.
    splits = [[start for start, _ in model_chunks(p)[1:]] for p in plan.pipelines]
    if (len(set(depths)) == 1 and len(set(chunks)) == 1
            and any(split != splits[0] for split in splits)):
        reasons.append(f"asymmetric pipelines: stage boundaries differ {splits}; {fmt}'s "
                       "data-parallel replicas all split the model the same way")
    micro_batches = [p.micro_batch_size for p in plan.pipelines]
    if len(set(micro_batches)) > 1:
        reasons.append(f"mixed micro-batch sizes {micro_batches}; {fmt} uses one for all replicas")
    counts = [p.num_micro_batches for p in plan.pipelines]
    if len(set(counts)) > 1:
        reasons.append(f"mixed micro-batch counts {counts}; {fmt} gives every data-parallel "
                       "replica the same number of micro-batches")
    return reasons + _schedule_reasons(plan, fmt, schedule, schedules)


def _recompute_all(plan: Plan, fmt: str) -> tuple[bool, list[str]]:
    """Whether every stage recomputes; a reason when only some do, since the frameworks'
    recomputation settings hold for every stage alike."""
    flags = [[s.recompute for s in p.stages] for p in plan.pipelines]
    every = [flag for stages in flags for flag in stages]
    if all(every) or not any(every):
        return all(every), []
    return False, [f"recompute on some stages only {flags}; {fmt}'s activation recomputation "
                   "settings apply to every stage alike"]


# Rank orders a (TP, PP, DP) grid can use, fastest-varying first.
TP_DP_PP, TP_PP_DP = "tp-dp-pp", "tp-pp-dp"


def _grid_rank(order: str, tp_rank: int, pipeline: int, stage: int, tp: int, pp: int,
               dp: int) -> int:
    if order == TP_DP_PP:
        return tp_rank + tp * pipeline + tp * dp * stage
    return tp_rank + tp * stage + tp * pp * pipeline


def _grid_placement(plan: Plan, ranks: RankMap, order: str
                    ) -> tuple[list[dict[str, Any]], list[str]]:
    """Per node, the grid ranks it holds in `order`; a reason for each node whose ranks are
    not one contiguous block, which torchrun requires (it numbers ranks node by node)."""
    tp, pp, dp = plan.pipelines[0].stages[0].tp, len(plan.pipelines[0].stages), len(plan.pipelines)
    grid_rank_of: dict[str, int] = {}
    for p, pipeline in enumerate(plan.pipelines):
        for s, stage in enumerate(pipeline.stages):
            for k, gpu in enumerate(stage.gpus):
                grid_rank_of[gpu] = _grid_rank(order, k, p, s, tp, pp, dp)
    nodes: list[dict[str, Any]] = []
    reasons: list[str] = []
    for node in ranks.nodes:
        gpus = [f"{node.name}:{i}" for i in node.device_indices]
        held = sorted(grid_rank_of[g] for g in gpus)
        if held != list(range(held[0], held[0] + len(held))):
            reasons.append(f"placement: node {node.name} would hold ranks {held}, not one "
                           f"contiguous block in {order} order, as torchrun requires")
        by_rank = sorted(gpus, key=grid_rank_of.__getitem__)
        nodes.append({"node": node.name, "first_rank": held[0], "nproc_per_node": len(held),
                      "CUDA_VISIBLE_DEVICES": ",".join(g.rpartition(":")[2] for g in by_rank)})
    nodes.sort(key=lambda n: n["first_rank"])
    for node_rank, entry in enumerate(nodes):
        entry["node_rank"] = node_rank
    return nodes, reasons


def _placement_in_some_order(
    plan: Plan, ranks: RankMap,
    prefer: Callable[[list[dict[str, Any]]], bool] | None = None,
) -> tuple[str, list[dict[str, Any]], list[str]]:
    """The first rank order in which every node holds a contiguous block (of those, the
    first whose nodes `prefer` takes), else the reasons for the default order."""
    placed = {order: _grid_placement(plan, ranks, order) for order in (TP_DP_PP, TP_PP_DP)}
    fitting = [order for order, (_, reasons) in placed.items() if not reasons]
    if fitting:
        chosen = next((o for o in fitting if prefer is None or prefer(placed[o][0])),
                      fitting[0])
        return chosen, placed[chosen][0], []
    return TP_DP_PP, placed[TP_DP_PP][0], [
        *placed[TP_DP_PP][1],
        f"placement: the {TP_PP_DP} order does not give contiguous node blocks either",
    ]


def _kind_reasons(kinds: Sequence[str], fmt: str) -> list[str]:
    standard = (len(kinds) >= 2 and kinds[0] == EMBEDDING and kinds[-1] == HEAD
                and set(kinds[1:-1]) <= {BLOCK})
    if standard:
        return []
    return [f"layer kinds {list(kinds)}; {fmt} builds embedding, blocks, head in that order"]


def _megatron_layout(kinds: Sequence[str], chunks: Sequence[LayerRange]) -> str:
    """Megatron's layout string, one segment per model chunk in model order (Megatron reads
    segment j * PP + s as virtual stage j of pipeline rank s, as the plan numbers chunks)."""
    letters = {EMBEDDING: "E", BLOCK: "t", HEAD: "L"}
    return "|".join("".join(letters[k] for k in kinds[start:end]) for start, end in chunks)


def _megatron_split_args(blocks_per_stage: list[int], layout: str) -> list[str]:
    num_stages = len(blocks_per_stage)
    if num_stages == 1 or len(set(blocks_per_stage)) == 1:
        return []  # Megatron's default even split
    first, *middle, last = blocks_per_stage
    if first > 0 and last > 0 and len(set(middle)) <= 1:
        # Older Megatron-LM (core >= 0.9) flags; middle stages share what is left evenly.
        return ["--decoder-first-pipeline-num-layers", str(first),
                "--decoder-last-pipeline-num-layers", str(last)]
    # Stages without blocks or uneven middles: only the layout flag (newer Megatron-LM) says so.
    return ["--pipeline-model-parallel-layout", layout]


def _megatron_virtual_args(blocks_per_chunk: list[int], chunks_per_stage: int, layout: str
                           ) -> list[str]:
    if len(set(blocks_per_chunk)) == 1:
        # Megatron's even split, model chunk by model chunk.
        return ["--num-virtual-stages-per-pipeline-rank", str(chunks_per_stage)]
    # The first/last-stage counts give every chunk of a stage the same blocks; only the layout
    # says an uneven interleaved split (it also sets the virtual size: segments / PP).
    return ["--pipeline-model-parallel-layout", layout]


def _megatron_interleave_reasons(plan: Plan) -> list[str]:
    first = plan.pipelines[0]
    pp, v, m = len(first.stages), first.stages[0].num_chunks, first.num_micro_batches
    if v == 1:
        return []
    if pp == 1:
        return [f"{v} chunks on a single stage; Megatron-LM interleaves model chunks across "
                "pipeline ranks, so with pipeline_model_parallel_size 1 give the stage one range"]
    if m % pp:
        return [f"{m} micro-batches on {pp} stages; Megatron-LM's interleaved schedule runs "
                "micro-batches in groups of pipeline_model_parallel_size, which must divide "
                "their number"]
    return []


def _megatron_recompute(plan: Plan, blocks_per_chunk: list[int]
                        ) -> tuple[list[str], list[str]]:
    """(arguments, reasons). Megatron checkpoints units of --recompute-num-layers blocks from
    the start of each chunk's blocks; the plan's recompute keeps one input per chunk, so the
    unit must be the whole chunk: every chunk with blocks holds the same number."""
    every, reasons = _recompute_all(plan, "Megatron-LM")
    if reasons or not every:
        return [], reasons
    counts = sorted({n for n in blocks_per_chunk if n > 0})
    if len(counts) > 1:
        return [], [f"recompute with {counts} blocks per chunk; Megatron-LM recomputes units of "
                    "--recompute-num-layers blocks, and no one unit makes each chunk a single "
                    "unit that keeps only its input, as the plan's recompute does"]
    return ["--recompute-granularity", "full", "--recompute-method", "uniform",
            "--recompute-num-layers", str(counts[0] if counts else 1)], []


def export_megatron(plan: Plan, *, layer_kinds: Sequence[str] | None = None,
                    job_schedule: str | None = None) -> dict[str, Any]:
    """Megatron-LM arguments for a plan whose pipelines are identical replicas."""
    ranks = build_rank_map(plan)
    kinds = _kinds(ranks.num_layers, layer_kinds)
    reasons = (_uniform_reasons(plan, "Megatron-LM", _schedule(plan, job_schedule),
                                (Schedule.ONE_F_ONE_B, Schedule.INTERLEAVED_1F1B))
               + _kind_reasons(kinds, "Megatron-LM"))
    first = plan.pipelines[0]
    chunks = model_chunks(first)
    blocks_per_chunk = [sum(1 for k in kinds[start:end] if k == BLOCK) for start, end in chunks]
    recompute_args, recompute_reasons = _megatron_recompute(plan, blocks_per_chunk)
    reasons += _megatron_interleave_reasons(plan) + recompute_reasons
    if not reasons:
        order, nodes, placement_reasons = _placement_in_some_order(plan, ranks)
        reasons += placement_reasons
    if reasons:
        raise UnsupportedExport("megatron", reasons)
    tp, pp, dp = first.stages[0].tp, len(first.stages), len(plan.pipelines)
    v = first.stages[0].num_chunks
    blocks_per_stage = [sum(blocks_per_chunk[j * pp + s] for j in range(v)) for s in range(pp)]
    num_blocks = sum(blocks_per_stage)
    layout = _megatron_layout(kinds, chunks)
    args = [
        "--tensor-model-parallel-size", str(tp), "--pipeline-model-parallel-size", str(pp),
        "--num-layers", str(num_blocks), "--micro-batch-size", str(first.micro_batch_size),
        "--global-batch-size", str(ranks.global_batch_size),
        *(_megatron_split_args(blocks_per_stage, layout) if v == 1
          else _megatron_virtual_args(blocks_per_chunk, v, layout)),
        *recompute_args,
        *(["--use-tp-pp-dp-mapping"] if order == TP_PP_DP else []),
    ]
    return {
        "format": "megatron",
        "tensor_model_parallel_size": tp,
        "pipeline_model_parallel_size": pp,
        "virtual_pipeline_model_parallel_size": v,
        "data_parallel_size": dp,
        "num_layers": num_blocks,
        "blocks_per_stage": blocks_per_stage,
        "blocks_per_chunk": blocks_per_chunk,
        "pipeline_model_parallel_layout": layout,
        "rank_order": order,
        "args": args,
        "nodes": nodes,
        "notes": [
            f"Megatron numbers ranks in {order} order (tp fastest); launch each node with "
            "torchrun --node-rank=<node_rank> --nproc-per-node=<nproc_per_node> and its "
            "CUDA_VISIBLE_DEVICES so that rank r lands on the plan's GPU.",
            "GPU types do not appear: Megatron treats every GPU alike.",
            *_megatron_notes(args, blocks_per_chunk),
            *_schedule_notes(plan, job_schedule),
        ],
    }


def _megatron_notes(args: list[str], blocks_per_chunk: list[int]) -> list[str]:
    notes = []
    if "--num-virtual-stages-per-pipeline-rank" in args:
        notes.append("Megatron-LM releases without --num-virtual-stages-per-pipeline-rank take "
                     f"--num-layers-per-virtual-pipeline-stage {blocks_per_chunk[0]} instead.")
    if "--recompute-granularity" in args:
        notes.append("Megatron-LM recomputes transformer blocks only: the embedding and the "
                     "output layer keep their activations, which the plan counts only as its "
                     "largest layer's on a recomputing stage.")
    return notes


def _deepspeed_recompute_note(interval: int) -> str:
    return (f"Recompute: PipelineModule(..., activation_checkpoint_interval={interval}) "
            "checkpoints each stage's layers as one group (its input kept, the forward run "
            "again in the backward); ds_config.pipeline.use_reentrant false makes it DeepSpeed's "
            "non-reentrant checkpoint: under the default reentrant one the first stage, whose "
            "input (token ids) needs no gradient, fails in its backward.")


def _deepspeed_launch_problems(nodes: list[dict[str, Any]]) -> list[str]:
    problems = []
    for n in nodes:
        order = [int(i) for i in n["CUDA_VISIBLE_DEVICES"].split(",")]
        if order != sorted(order):
            problems.append(f"{n['node']} takes its ranks on GPUs {order}, not in ascending "
                            "order (DeepSpeed's launcher sorts a node's GPUs)")
        if n["first_rank"] % n["nproc_per_node"]:
            problems.append(f"{n['node']} starts at rank {n['first_rank']} with "
                            f"{n['nproc_per_node']} processes (DeepSpeed's launcher sets "
                            "LOCAL_RANK to RANK modulo the node's process count)")
    return problems


def _deepspeed_launch(nodes: list[dict[str, Any]], *, master_addr: str, master_port: int,
                      training_module: str, plan_path: str, script_args: Sequence[str]
                      ) -> tuple[dict[str, Any] | None, list[str]]:
    """DeepSpeed's own launcher (`deepspeed --hostfile`): a hostfile listing the nodes in
    rank order and `--include` naming each node's GPUs. That launcher numbers ranks node by
    node in hostfile order, a node's GPUs in ascending index order (it sorts the list), and
    sets LOCAL_RANK to RANK modulo the node's process count: it runs the plan's ranks only
    where each node's GPUs take its ranks in ascending order and its first rank is a
    multiple of its process count. None elsewhere, with the reasons."""
    problems = _deepspeed_launch_problems(nodes)
    if problems:
        return None, ["No `deepspeed --hostfile` command: " + "; ".join(problems)
                      + ". Start each node with torchrun instead (ranks and devices in nodes)."]
    slots = [max(int(i) for i in n["CUDA_VISIBLE_DEVICES"].split(",")) + 1 for n in nodes]
    hostfile = [f"{n['node']} slots={k}" for n, k in zip(nodes, slots, strict=True)]
    include = "@".join(f"{n['node']}:{n['CUDA_VISIBLE_DEVICES']}" for n in nodes)
    argv = ["deepspeed", "--hostfile=hostfile", f"--include={include}",
            f"--master_addr={master_addr}", f"--master_port={master_port}",
            # LOCAL_RANK comes in the environment; no --local_rank argument for the module.
            "--no_local_rank", "--module", training_module, "--plan", plan_path, *script_args]
    return {"hostfile": hostfile, "argv": argv, "command": shlex.join(argv)}, [
        "Launch: write `hostfile` (one line per node, in rank order) and run `command` on the "
        "first node; DeepSpeed reaches the others over ssh (pdsh) and numbers ranks as "
        "`nodes` lists them (the topology's rank order)."]


def export_deepspeed(
    plan: Plan, *, layer_kinds: Sequence[str] | None = None, zero_stage: int = 0,
    job_schedule: str | None = None, master_addr: str | None = None,
    master_port: int = DEFAULT_MASTER_PORT, training_module: str = "launcher.train",
    plan_path: str = "plan.json", script_args: Sequence[str] = (),
) -> dict[str, Any]:
    """DeepSpeed PipelineModule settings and a ds_config for a plan whose pipelines are
    identical replicas (an uneven split is given as stage bounds), and the command of
    DeepSpeed's own launcher where it numbers ranks and devices as the plan does."""
    ranks = build_rank_map(plan)
    kinds = _kinds(ranks.num_layers, layer_kinds)
    reasons = (_uniform_reasons(plan, "DeepSpeed", _schedule(plan, job_schedule))
               + _kind_reasons(kinds, "DeepSpeed"))
    if zero_stage not in (0, 1):
        reasons.append(f"zero_stage {zero_stage}; DeepSpeed's pipeline engine supports ZeRO 0 or 1")
    recompute, recompute_reasons = _recompute_all(plan, "DeepSpeed")
    reasons += recompute_reasons
    if not reasons:
        order, nodes, placement_reasons = _placement_in_some_order(
            plan, ranks, prefer=lambda placed: not _deepspeed_launch_problems(placed))
        reasons += placement_reasons
    if reasons:
        raise UnsupportedExport("deepspeed", reasons)
    first = plan.pipelines[0]
    tp, pp, dp = first.stages[0].tp, len(first.stages), len(plan.pipelines)
    layer_counts = [s.layers[1] - s.layers[0] for s in first.stages]
    even = len(set(layer_counts)) == 1
    # One checkpointed group per stage (PipelineModule groups activation_checkpoint_interval
    # layers from each stage's first): only the stage's input is kept, as the plan has it.
    interval = max(layer_counts) if recompute else 0
    ds_config: dict[str, Any] = {
        "train_batch_size": ranks.global_batch_size,
        "train_micro_batch_size_per_gpu": first.micro_batch_size,
        "gradient_accumulation_steps": first.num_micro_batches,
        "zero_optimization": {"stage": zero_stage},
    }
    if zero_stage > 0:
        # ZeRO refuses optimizers DeepSpeed did not write (torch.optim.*) without this.
        ds_config["zero_allow_untested_optimizer"] = True
    if recompute:
        # Under the default reentrant checkpoint the first stage's backward fails: its input,
        # token ids, needs no gradient, so neither does the checkpointed output (DeepSpeed
        # 0.19.8: "element 0 of tensors does not require grad").
        ds_config["pipeline"] = {"use_reentrant": False}
    launch, launch_notes = _deepspeed_launch(
        nodes, master_addr=master_addr or nodes[0]["node"], master_port=master_port,
        training_module=training_module, plan_path=plan_path, script_args=script_args)
    return {
        "format": "deepspeed",
        "pipeline_module": {
            "num_stages": pp,
            # partition_method knows "uniform", "parameters" and "type:<regex>", never
            # explicit bounds: an uneven split needs stage_bounds (BoundedPipelineModule).
            "partition_method": "uniform" if even else None,
            "stage_bounds": [0, *(stage.layers[1] for stage in first.stages)],
            "layer_counts": layer_counts,
            "layer_kinds": list(kinds),
            "activation_checkpoint_interval": interval,
        },
        # ProcessTopology lists axes slowest first; PipeModelDataParallelTopology is the
        # tp-dp-pp case.
        "topology": {"class": "ProcessTopology",
                     "axes": ["pipe", "data", "model"] if order == TP_DP_PP
                     else ["data", "pipe", "model"],
                     "dims": [pp, dp, tp] if order == TP_DP_PP else [dp, pp, tp]},
        "rank_order": order,
        "ds_config": ds_config,
        "nodes": nodes,
        "launch": launch,
        "notes": [
            "Merge ds_config into your own: it holds what the plan decides. Other settings "
            "keep DeepSpeed's defaults, among them gradient_clipping (1.0 in DeepSpeed 0.19).",
            *launch_notes,
            *([] if even else [
                "Uneven split: build the model with launcher.deepspeed_pipe.BoundedPipelineModule"
                "(layers, stage_bounds=pipeline_module.stage_bounds, topology=...), a "
                "PipelineModule that takes explicit stage bounds (docs/launching.md)."]),
            *(["TP inside a DeepSpeed pipeline needs a Megatron-style mpu (Megatron-DeepSpeed); "
               "with tp > 1 pass topology to PipelineModule and build TP layers."]
              if tp > 1 else []),
            *([_deepspeed_recompute_note(interval)] if recompute else []),
            *_schedule_notes(plan, job_schedule),
        ],
    }
