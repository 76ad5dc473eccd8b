"""DeepSpeed's own launcher (`deepspeed --hostfile`), checked by DeepSpeed: its parsers read
the export's hostfile and `--include`, and its launcher's numbering (ranks node by node,
LOCAL_RANK as RANK modulo the node's processes) puts every rank on the GPU, stage and
replica DeepSpeed's ProcessTopology gives it under the exported axes, which is the plan's;
a real launch on one node hands each process the plan's RANK and LOCAL_RANK; plans it would
number wrongly get no command, with the reason."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("deepspeed")

from deepspeed.launcher import runner  # noqa: E402
from deepspeed.runtime.pipe.topology import ProcessTopology  # noqa: E402

from planner import UnsupportedExport, parse_plan  # noqa: E402
from planner.documents import Plan  # noqa: E402
from planner.export import export_plan  # noqa: E402

DATA = Path(__file__).parent / "data"
ROOT = Path(__file__).resolve().parents[2]


def _plan(nodes: dict[str, list[int]], *, tp: int = 1, pp: int = 2) -> Plan:
    """Identical pipelines of `pp` stages at `tp` over the GPUs of `nodes`, taken in order:
    pipeline after pipeline, stage after stage."""
    gpus = [f"{name}:{i}" for name, indices in nodes.items() for i in indices]
    per_pipeline = tp * pp
    pipelines = []
    for p in range(len(gpus) // per_pipeline):
        mine = gpus[p * per_pipeline:(p + 1) * per_pipeline]
        pipelines.append({"micro_batch_size": 1, "num_micro_batches": 4, "stages": [
            {"gpu_type": "cpu", "tp": tp, "gpus": mine[s * tp:(s + 1) * tp],
             "layers": [2 * s, 2 * s + 2]} for s in range(pp)]})
    return parse_plan({"format": "hetplan-plan/1", "schedule": "1f1b", "pipelines": pipelines})


def _launchable() -> list[tuple[str, Plan]]:
    plans = [(path.name, parse_plan(json.loads(path.read_text())))
             for path in sorted(DATA.glob("*.plan.json"))]
    plans += [("two nodes", _plan({"n0": [0, 1, 2, 3], "n1": [0, 1, 2, 3]})),
              ("tp2 on one node", _plan({"n0": list(range(8))}, tp=2)),
              ("stages across nodes", _plan({"n0": [0, 1], "n1": [0, 1]}))]
    out = []
    for name, plan in plans:
        try:
            export = export_plan(plan, "deepspeed")
        except UnsupportedExport:
            continue
        if export["launch"] is not None:
            out.append((name, plan))
    return out


def _deepspeed_ranks(export: dict[str, Any]) -> dict[int, tuple[str, int, int]]:
    """RANK -> (node, GPU index, LOCAL_RANK) as DeepSpeed's runner and launcher give them."""
    args = runner.parse_args(export["launch"]["argv"][1:])
    pool = runner._parse_hostfile(export["launch"]["hostfile"])
    active = runner.parse_inclusion_exclusion(pool, args.include, args.exclude)
    assigned: dict[int, tuple[str, int, int]] = {}
    rank = 0
    for node, gids in active.items():  # deepspeed/launcher/launch.py numbers ranks so
        for _ in gids:
            # CUDA_VISIBLE_DEVICES lists gids; the process takes the one at LOCAL_RANK.
            local_rank = rank % len(gids)
            assigned[rank] = (node, gids[local_rank], local_rank)
            rank += 1
    return assigned


LAUNCHABLE = _launchable()


def test_some_plans_of_every_shape_get_a_launch_command() -> None:
    names = [name for name, _ in LAUNCHABLE]
    assert {"two nodes", "tp2 on one node", "stages across nodes"} <= set(names)
    assert any(name.endswith(".plan.json") for name in names)


@pytest.mark.parametrize(("name", "plan"), LAUNCHABLE, ids=[n for n, _ in LAUNCHABLE])
def test_deepspeed_numbers_every_gpu_as_the_plan_places_it(name: str, plan: Plan) -> None:
    export = export_plan(plan, "deepspeed")
    topology = ProcessTopology(axes=export["topology"]["axes"], dims=export["topology"]["dims"])
    assigned = _deepspeed_ranks(export)
    assert sorted(assigned) == list(range(sum(len(s.gpus) for p in plan.pipelines
                                              for s in p.stages)))
    held = {gpu: (p, s, k) for p, pipeline in enumerate(plan.pipelines)
            for s, stage in enumerate(pipeline.stages) for k, gpu in enumerate(stage.gpus)}
    for rank, (node, gid, local_rank) in assigned.items():
        coord = topology.get_coord(rank)
        assert held[f"{node}:{gid}"] == (coord.data, coord.pipe, coord.model), (name, rank)
        assert local_rank == rank - min(r for r, a in assigned.items() if a[0] == node)


@pytest.mark.parametrize(("nodes", "why"), [
    ({"n0": [0, 1], "n1": [0, 1, 2, 3]}, "LOCAL_RANK"),  # n1 starts at rank 2 with 4
    ({"n0": [1, 0, 3, 2]}, "ascending"),                  # ranks on GPUs 1, 0, 3, 2
])
def test_no_command_where_deepspeed_would_number_ranks_otherwise(nodes: dict[str, list[int]],
                                                                  why: str) -> None:
    export = export_plan(_plan(nodes), "deepspeed")
    assert export["launch"] is None
    assert any("No `deepspeed --hostfile` command" in note and why in note
               for note in export["notes"])


@pytest.mark.slow
def test_a_real_launch_on_one_node_gives_each_process_the_plan_rank(tmp_path: Path) -> None:
    plan = _plan({"n0": [0, 1, 2, 3]})
    export = export_plan(plan, "deepspeed", master_addr="127.0.0.1", master_port=29613,
                         training_module="tests.launcher.rank_probe",
                         script_args=["--out", str(tmp_path)])
    launch = export["launch"]
    (tmp_path / "hostfile").write_text("\n".join(launch["hostfile"]) + "\n")
    # One node: DeepSpeed starts its processes here; the ssh check is for many nodes.
    argv = [sys.executable, "-m", "deepspeed.launcher.runner", "--no_ssh_check",
            *launch["argv"][1:]]
    argv[argv.index("--hostfile=hostfile")] = f"--hostfile={tmp_path / 'hostfile'}"
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    expected = _deepspeed_ranks(export)
    for rank, (_, _, local_rank) in expected.items():
        seen = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert (seen["RANK"], seen["LOCAL_RANK"], seen["WORLD_SIZE"]) == (
            str(rank), str(local_rank), str(len(expected)))
        assert seen["argv"][:2] == ["--plan", "plan.json"]
