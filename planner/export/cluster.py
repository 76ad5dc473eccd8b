"""Plans written for cluster schedulers: a Kubernetes JobSet and a Slurm batch script.

Both start the torchrun commands of `formats.torchrun_argv` on the plan's nodes, one
per node, with the rank map's node ranks, so any plan a training module can run (the
reference launcher runs every plan) can be scheduled. Nodes are grouped by GPU type and
process count; each group asks the scheduler for that many nodes of that GPU type:

- Kubernetes: one JobSet (jobset.x-k8s.io/v1alpha2) with one replicated job per group,
  an Indexed Job whose pods pick their node rank from `JOB_COMPLETION_INDEX`, select nodes
  by the `nvidia.com/gpu.product` label and reach the node-rank-0 pod by the DNS name
  JobSet gives it;
- Slurm: one heterogeneous job component per GPU type and one `srun` per node.

The scheduler, not the plan, picks which physical GPUs a node's processes get (the device
plugin, or Slurm's GRES), so the plan's device indices do not appear.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from planner.documents import Plan
from planner.errors import UnsupportedExport
from planner.export.formats import DEFAULT_MASTER_PORT, torchrun_argv
from planner.export.ranks import RankMap, build_rank_map

__all__ = ["GPU_PRODUCT_LABEL", "NodeGroup", "export_kubernetes", "export_slurm", "node_groups"]

GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
"""The node label NVIDIA's GPU feature discovery sets to the GPU's product name."""
JOBSET_API_VERSION = "jobset.x-k8s.io/v1alpha2"
DEFAULT_IMAGE = "pytorch/pytorch"
_DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


@dataclass(frozen=True, kw_only=True)
class NodeGroup:
    """Nodes of one GPU type that run the same number of processes."""

    gpu_type: str
    nproc_per_node: int
    nodes: tuple[str, ...]
    """Plan node names, in node-rank order."""
    node_ranks: tuple[int, ...]
    first_ranks: tuple[int, ...]
    """Global rank of each node's local rank 0."""


def _node_types(plan: Plan, ranks: RankMap, fmt: str) -> dict[str, str]:
    """GPU type of every node; UnsupportedExport for a node whose GPUs differ in type (a
    scheduler selects a node by one GPU product)."""
    types: dict[str, set[str]] = {}
    for pipeline in plan.pipelines:
        for stage in pipeline.stages:
            for gpu in stage.gpus:
                types.setdefault(gpu.rpartition(":")[0], set()).add(stage.gpu_type)
    mixed = [f"node {node} holds GPU types {sorted(found)}; a scheduler selects a node by "
             "one GPU product" for node, found in types.items() if len(found) > 1]
    if mixed:
        raise UnsupportedExport(fmt, mixed)
    return {node.name: next(iter(types[node.name])) for node in ranks.nodes}


def node_groups(plan: Plan, ranks: RankMap, fmt: str) -> list[NodeGroup]:
    """The plan's nodes grouped by (GPU type, processes), groups in order of their first
    node rank; `fmt` names the export in a refusal."""
    types = _node_types(plan, ranks, fmt)
    members: dict[tuple[str, int], list[Any]] = {}
    for node in ranks.nodes:
        members.setdefault((types[node.name], node.num_processes), []).append(node)
    return [NodeGroup(gpu_type=gpu_type, nproc_per_node=nproc,
                      nodes=tuple(n.name for n in nodes),
                      node_ranks=tuple(n.node_rank for n in nodes),
                      first_ranks=tuple(n.first_rank for n in nodes))
            for (gpu_type, nproc), nodes in members.items()]


def _check_name(name: str) -> None:
    if len(name) > 40 or not _DNS_LABEL.match(name):
        raise ValueError(f"name {name!r}: use at most 40 lowercase letters, digits and '-', "
                         "starting with a letter (it becomes Kubernetes and DNS names)")


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "gpu"


def _group_names(groups: Sequence[NodeGroup]) -> list[str]:
    """Short, unique DNS labels: pod hostnames are <jobset>-<group>-<job>-<pod>."""
    return [f"g{i}-{_slug(g.gpu_type)}"[:20].rstrip("-") for i, g in enumerate(groups)]


def _command_line(argv: list[str], variables: Mapping[str, str]) -> str:
    """`argv` quoted for bash, with each `@NAME@` placeholder turned into a double-quoted
    expansion of the shell variable it names."""
    words = []
    for word in argv:
        quoted = shlex.quote(word)
        for placeholder, variable in variables.items():
            if placeholder in word:
                quoted = '"' + word.replace(placeholder, f"${{{variable}}}") + '"'
        words.append(quoted)
    return " ".join(words)


def _launch_argv(ranks: RankMap, group: NodeGroup, *, node_rank: str, master_port: int,
                 training_module: str, plan_path: str, script_args: Sequence[str]) -> list[str]:
    return torchrun_argv(num_nodes=len(ranks.nodes), nproc_per_node=group.nproc_per_node,
                         node_rank=node_rank, master_addr="@MASTER_ADDR@",
                         master_port=str(master_port), training_module=training_module,
                         plan_path=plan_path, script_args=script_args)


SHELL_VARIABLES = {"@NODE_RANK@": "NODE_RANK", "@MASTER_ADDR@": "MASTER_ADDR"}


# ---------------------------------------------------------------- Kubernetes


def _pod_script(launch: list[str]) -> str:
    return "\n".join([
        "set -euo pipefail",
        "read -r -a node_ranks <<< \"$NODE_RANKS\"",
        "read -r -a first_ranks <<< \"$FIRST_RANKS\"",
        "export NODE_RANK=\"${node_ranks[$JOB_COMPLETION_INDEX]}\"",
        "export FIRST_RANK=\"${first_ranks[$JOB_COMPLETION_INDEX]}\"",
        "exec " + _command_line(launch, SHELL_VARIABLES),
    ])


def _replicated_job(group: NodeGroup, group_name: str, launch: list[str],
                    env: list[dict[str, str]], *, image: str, gpu_name: str) -> dict[str, Any]:
    count = len(group.nodes)
    container = {
        "name": "trainer",
        "image": image,
        "command": ["bash", "-c", _pod_script(launch)],
        "env": [*env,
                {"name": "NODE_RANKS", "value": " ".join(map(str, group.node_ranks))},
                {"name": "FIRST_RANKS", "value": " ".join(map(str, group.first_ranks))}],
        "resources": {"limits": {"nvidia.com/gpu": group.nproc_per_node}},
    }
    return {
        "name": group_name,
        "replicas": 1,
        "template": {"spec": {
            "completionMode": "Indexed", "completions": count, "parallelism": count,
            "backoffLimit": 0,
            "template": {"spec": {
                "restartPolicy": "Never",
                "nodeSelector": {GPU_PRODUCT_LABEL: gpu_name},
                "containers": [container],
            }},
        }},
    }


def export_kubernetes(
    plan: Plan, *, name: str = "hetplan-train", image: str = DEFAULT_IMAGE,
    master_port: int = DEFAULT_MASTER_PORT, training_module: str = "launcher.train",
    plan_path: str = "plan.json", script_args: Sequence[str] = (),
    gpu_names: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A JobSet with one replicated job per node group (see the module docstring)."""
    _check_name(name)
    ranks = build_rank_map(plan)
    groups = node_groups(plan, ranks, "kubernetes")
    names = _group_names(groups)
    gpu_names = dict(gpu_names or {})
    (master,) = [(names[g], group.node_ranks.index(0)) for g, group in enumerate(groups)
                 if 0 in group.node_ranks]
    master_addr = f"{name}-{master[0]}-0-{master[1]}.{name}"
    env = [{"name": "MASTER_ADDR", "value": master_addr},
           {"name": "MASTER_PORT", "value": str(master_port)}]
    jobs = [_replicated_job(group, group_name,
                            _launch_argv(ranks, group, node_rank="@NODE_RANK@",
                                         master_port=master_port,
                                         training_module=training_module, plan_path=plan_path,
                                         script_args=script_args),
                            env, image=image, gpu_name=gpu_names.get(group.gpu_type,
                                                                     group.gpu_type))
            for group, group_name in zip(groups, names, strict=True)]
    return {
        "format": "kubernetes",
        "manifest": {
            "apiVersion": JOBSET_API_VERSION,
            "kind": "JobSet",
            "metadata": {"name": name},
            "spec": {"network": {"enableDNSHostnames": True}, "replicatedJobs": jobs},
        },
        "groups": [{"name": n, "gpu_type": g.gpu_type, "nproc_per_node": g.nproc_per_node,
                    "nodes": list(g.nodes), "node_ranks": list(g.node_ranks)}
                   for n, g in zip(names, groups, strict=True)],
        "notes": [
            f"Nodes are selected by their {GPU_PRODUCT_LABEL} label; the plan's GPU type is "
            "used as its value unless gpu_names maps it to the product name the cluster "
            "reports (e.g. NVIDIA-A100-SXM4-80GB).",
            "The image needs torch and the training module; the plan file must be at "
            "plan_path inside the container (a ConfigMap volume, or baked into the image).",
            "Needs the JobSet controller (jobset.x-k8s.io) and the NVIDIA device plugin.",
        ],
    }


# ---------------------------------------------------------------- Slurm


def _components(groups: Sequence[NodeGroup]) -> list[tuple[str, list[NodeGroup]]]:
    """One heterogeneous job component per GPU type, in order of first node rank."""
    by_type: dict[str, list[NodeGroup]] = {}
    for group in groups:
        by_type.setdefault(group.gpu_type, []).append(group)
    return list(by_type.items())


def export_slurm(
    plan: Plan, *, name: str = "hetplan-train", master_port: int = DEFAULT_MASTER_PORT,
    training_module: str = "launcher.train", plan_path: str = "plan.json",
    script_args: Sequence[str] = (), gpu_names: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A batch script: one heterogeneous job component per GPU type (selected with
    `--constraint`, default the GPU type's name), one `srun` per node."""
    _check_name(name)
    ranks = build_rank_map(plan)
    gpu_names = dict(gpu_names or {})
    components = _components(node_groups(plan, ranks, "slurm"))
    heterogeneous = len(components) > 1
    header = ["#!/bin/bash", f"# {name}: {ranks.world_size} processes on {len(ranks.nodes)} "
              "nodes, written by hetplan export --format slurm",
              f"#SBATCH --job-name={name}"]
    where: dict[int, tuple[int, int]] = {}  # node rank -> (component, node index in it)
    for c, (gpu_type, groups) in enumerate(components):
        node_ranks = sorted(r for g in groups for r in g.node_ranks)
        where |= {rank: (c, i) for i, rank in enumerate(node_ranks)}
        if c > 0:
            header.append("#SBATCH hetjob")
        header.append(f"#SBATCH --nodes={len(node_ranks)} --ntasks-per-node=1 "
                      f"--gres=gpu:{max(g.nproc_per_node for g in groups)} "
                      f"--constraint={gpu_names.get(gpu_type, gpu_type)}")
    master_component, master_index = where[0]
    nodelist = (f"SLURM_JOB_NODELIST_HET_GROUP_{master_component}" if heterogeneous
                else "SLURM_JOB_NODELIST")
    body = ["set -euo pipefail",
            f"MASTER_ADDR=$(scontrol show hostnames \"${nodelist}\" | sed -n {master_index + 1}p)",
            "pids=()"]
    for node in ranks.nodes:
        component, index = where[node.node_rank]
        group = next(g for g in components[component][1] if node.name in g.nodes)
        srun = ["srun", *([f"--het-group={component}"] if heterogeneous else []),
                "--nodes=1", "--ntasks=1", f"--relative={index}",
                *_launch_argv(ranks, group, node_rank=str(node.node_rank),
                              master_port=master_port, training_module=training_module,
                              plan_path=plan_path, script_args=script_args)]
        body += [f"# plan node {node.name}: node rank {node.node_rank}, ranks "
                 f"{node.first_rank}-{node.first_rank + node.num_processes - 1}",
                 _command_line(srun, SHELL_VARIABLES) + " &",
                 'pids+=("$!")']
    body += ["status=0", 'for pid in "${pids[@]}"; do wait "$pid" || status=$?; done',
             'exit "$status"']
    return {
        "format": "slurm",
        "script": "\n".join([*header, "", *body]) + "\n",
        "components": [{"gpu_type": t, "constraint": gpu_names.get(t, t),
                        "nodes": [n for g in groups for n in g.nodes]}
                       for t, groups in components],
        "notes": [
            "Submit with sbatch from the folder holding the plan (plan_path) and the training "
            "module; torchrun must be on PATH on every node.",
            "Each component asks for nodes with the GPU type as a node feature "
            "(--constraint); map types to your cluster's feature names with gpu_names.",
        ],
    }
