"""A harsher judge: can a long local search over plan documents beat the search's plans?

`bench/wider_search.py` raises the search's own limits, so it shares the search's design and
its blind spots. This script shares only the least-time batch shares with it: it starts
from a plan (the search's, and the per-type reference) and walks the version-1 plan space
by moves on the document itself, each judged by the reference estimator
(`planner.evaluate`), for a fixed time per input.

Moves, on one pipeline or on every replica of its shape at once:
- a boundary between two stages moved by one or two layers;
- micro-batches moved from one pipeline to another;
- a micro-batch size doubled or halved, the pipeline's samples unchanged;
- a stage's tp raised with idle GPUs of its node, or lowered (GPUs set free);
- a stage split in two, the second half on idle GPUs of any node and type;
- two neighbouring stages merged onto the GPUs of one of them;
- a stage moved onto idle GPUs of another node (any type, any profiled tp);
- a pipeline dropped (its micro-batches to the others), or copied onto idle GPUs;
- two stages of different pipelines trading their GPUs;
- GPUs set free by one move and used by two or three more (a compound move).
Every move but the micro-batch one is followed by the least-time batch shares of
`refine.rebalance`. Moves are accepted by simulated annealing (worse by at most a
temperature that falls from 1% to 0 over the run), and the walk restarts from the best plan
found whenever it has gone a while without improving.

If the walk finds faster plans, what the moves changed shows where the search is blind;
if it finds none in minutes per input, the search's plans are at least local optima of a
neighbourhood much wider than its own polish (`planner/search/polish.py`).

Usage: python bench/local_search.py [--seconds S] [--sets measured,generated]
       [--only NAME] [--perturbed N] [--seed N] [--out DIR]
The shared inputs are walked from hetplan's plan and from the per-type reference; the
perturbed ones (held-out inputs of the same families, `bench/perturbed.py`) from hetplan's
plan only.
"""

from __future__ import annotations

import argparse
import collections
import copy
import json
import math
import platform
import random
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from perturbed import perturbed
from plan_quality import REFERENCE, SETS, geomean

from planner import SearchOptions, evaluate, parse_plan, parse_scenario, plan
from planner.costs import ProfileIndex
from planner.documents import Plan, Scenario
from planner.search.refine import rebalance

PlanDict = dict[str, Any]
Move = Callable[["Space", random.Random, PlanDict], PlanDict | None]


class Space:
    """What the moves need to know of a scenario: nodes, idle GPUs, profiled points."""

    def __init__(self, scenario: Scenario) -> None:
        self.node_type = {n.name: n.gpu_type for n in scenario.cluster.nodes}
        self.node_gpus = {n.name: n.gpus for n in scenario.cluster.nodes}
        index = ProfileIndex(scenario.profiles)
        kinds = set(scenario.model.layers)
        self.points = {t: set(index.complete_points(t, kinds)) for t in scenario.gpu_types}
        self.tps = {t: sorted({tp for _, tp in pts}) for t, pts in self.points.items()}

    def idle(self, plan_doc: PlanDict) -> dict[str, list[str]]:
        used = {g for p in plan_doc["pipelines"] for s in p["stages"] for g in s["gpus"]}
        return {node: [f"{node}:{i}" for i in range(count) if f"{node}:{i}" not in used]
                for node, count in self.node_gpus.items()}

    def profiled(self, gpu_type: str, size: int, tp: int) -> bool:
        return (size, tp) in self.points.get(gpu_type, ())


def _node(gpu: str) -> str:
    return gpu.rsplit(":", 1)[0]


def _replicas(plan_doc: PlanDict, p: int, together: bool) -> list[int]:
    """Pipeline p alone, or every pipeline of its shape (micro-batch size, types, tp, layers)."""
    if not together:
        return [p]

    def shape(q: int) -> tuple[object, ...]:
        pipe = plan_doc["pipelines"][q]
        return (pipe["micro_batch_size"],
                tuple((s["gpu_type"], s["tp"], tuple(s["layers"])) for s in pipe["stages"]))

    key = shape(p)
    return [q for q in range(len(plan_doc["pipelines"])) if shape(q) == key]


def _random_stage(rng: random.Random, pipes: list[dict[str, Any]]) -> tuple[int, int]:
    p = rng.randrange(len(pipes))
    return p, rng.randrange(len(pipes[p]["stages"]))


def _random_cut(rng: random.Random, pipes: list[dict[str, Any]]) -> tuple[int, int] | None:
    """A pipeline of two stages or more and one of its boundaries (after stage s)."""
    p = rng.randrange(len(pipes))
    if len(pipes[p]["stages"]) < 2:
        return None
    return p, rng.randrange(len(pipes[p]["stages"]) - 1)


def move_boundary(space: Space, rng: random.Random, doc: PlanDict) -> PlanDict | None:
    pipes = doc["pipelines"]
    if (cut := _random_cut(rng, pipes)) is None:
        return None
    p, s = cut
    step = rng.choice((-2, -1, 1, 2))
    for q in _replicas(doc, p, rng.random() < 0.7):
        stages = pipes[q]["stages"]
        moved = stages[s]["layers"][1] + step
        if not stages[s]["layers"][0] < moved < stages[s + 1]["layers"][1]:
            return None
        stages[s]["layers"][1] = stages[s + 1]["layers"][0] = moved
    return doc


def move_micro_batches(space: Space, rng: random.Random, doc: PlanDict) -> PlanDict | None:
    pipes = doc["pipelines"]
    if len(pipes) < 2:
        return None
    p, q = rng.sample(range(len(pipes)), 2)
    bp, bq = pipes[p]["micro_batch_size"], pipes[q]["micro_batch_size"]
    samples = bp * bq // math.gcd(bp, bq) * rng.choice((1, 1, 2))
    if pipes[p]["num_micro_batches"] * bp <= samples:
        return None
    pipes[p]["num_micro_batches"] -= samples // bp
    pipes[q]["num_micro_batches"] += samples // bq
    return doc


def move_micro_batch_size(space: Space, rng: random.Random, doc: PlanDict) -> PlanDict | None:
    pipes = doc["pipelines"]
    p = rng.randrange(len(pipes))
    b, m = pipes[p]["micro_batch_size"], pipes[p]["num_micro_batches"]
    size, count = (2 * b, m // 2) if rng.random() < 0.5 else (b // 2, 2 * m)
    if size < 1 or size * count != b * m:
        return None
    for q in _replicas(doc, p, rng.random() < 0.7):
        pipe = pipes[q]
        if pipe["micro_batch_size"] * pipe["num_micro_batches"] != b * m or not all(
                space.profiled(s["gpu_type"], size, s["tp"]) for s in pipe["stages"]):
            return None
        pipe["micro_batch_size"], pipe["num_micro_batches"] = size, count
    return doc


def move_tp(space: Space, rng: random.Random, doc: PlanDict) -> PlanDict | None:
    pipes = doc["pipelines"]
    p, s = _random_stage(rng, pipes)
    idle = space.idle(doc)
    b = pipes[p]["micro_batch_size"]
    stage = pipes[p]["stages"][s]
    options = [tp for tp in space.tps[stage["gpu_type"]]
               if tp != stage["tp"] and space.profiled(stage["gpu_type"], b, tp)]
    if not options:
        return None
    tp = rng.choice(options)
    for q in _replicas(doc, p, rng.random() < 0.5):
        st = pipes[q]["stages"][s]
        if tp < st["tp"]:
            st["gpus"] = st["gpus"][:tp]
        else:
            free = idle[_node(st["gpus"][0])]
            if len(free) < tp - st["tp"]:
                return None
            st["gpus"] = st["gpus"] + [free.pop() for _ in range(tp - st["tp"])]
        st["tp"] = tp
    return doc


def _place(space: Space, rng: random.Random, idle: dict[str, list[str]], size: int,
           same_type: str | None = None) -> dict[str, Any] | None:
    """A stage without layers on idle GPUs of a random node that has room for a profiled
    tp at micro-batch `size`."""
    choices = []
    for node, free in idle.items():
        gpu_type = space.node_type[node]
        if same_type is not None and gpu_type != same_type:
            continue
        for tp in space.tps[gpu_type]:
            if tp <= len(free) and space.profiled(gpu_type, size, tp):
                choices.append((node, gpu_type, tp))
    if not choices:
        return None
    node, gpu_type, tp = rng.choice(choices)
    return {"gpu_type": gpu_type, "tp": tp, "gpus": [idle[node].pop() for _ in range(tp)]}


def move_split(space: Space, rng: random.Random, doc: PlanDict) -> PlanDict | None:
    pipes = doc["pipelines"]
    p, s = _random_stage(rng, pipes)
    start, end = pipes[p]["stages"][s]["layers"]
    if end - start < 2:
        return None
    cut = rng.randrange(start + 1, end)
    idle = space.idle(doc)
    same = pipes[p]["stages"][s]["gpu_type"] if rng.random() < 0.5 else None
    for q in _replicas(doc, p, rng.random() < 0.5):
        stages = pipes[q]["stages"]
        new = _place(space, rng, idle, pipes[q]["micro_batch_size"], same)
        if new is None:
            return None
        same = new["gpu_type"]
        new["layers"] = [cut, stages[s]["layers"][1]]
        stages[s]["layers"] = [stages[s]["layers"][0], cut]
        stages.insert(s + 1, new)
    return doc


def move_merge(space: Space, rng: random.Random, doc: PlanDict) -> PlanDict | None:
    pipes = doc["pipelines"]
    if (cut := _random_cut(rng, pipes)) is None:
        return None
    p, s = cut
    keep_second = rng.random() < 0.5
    for q in _replicas(doc, p, rng.random() < 0.5):
        stages = pipes[q]["stages"]
        first, second = stages[s], stages[s + 1]
        kept = second if keep_second else first
        kept["layers"] = [first["layers"][0], second["layers"][1]]
        stages[s:s + 2] = [kept]
    return doc


def move_relocate(space: Space, rng: random.Random, doc: PlanDict) -> PlanDict | None:
    pipes = doc["pipelines"]
    p, s = _random_stage(rng, pipes)
    idle = space.idle(doc)
    same = None
    for q in _replicas(doc, p, rng.random() < 0.5):
        old = pipes[q]["stages"][s]
        new = _place(space, rng, idle, pipes[q]["micro_batch_size"], same)
        if new is None:
            return None
        same = new["gpu_type"]
        new["layers"] = old["layers"]
        pipes[q]["stages"][s] = new
    return doc


def move_drop(space: Space, rng: random.Random, doc: PlanDict) -> PlanDict | None:
    pipes = doc["pipelines"]
    if len(pipes) < 2:
        return None
    p = rng.randrange(len(pipes))
    left = pipes[p]["micro_batch_size"] * pipes[p]["num_micro_batches"]
    del pipes[p]
    # The dropped samples go to the others, largest micro-batches first, so that any count
    # a smaller size divides is placed; the structural moves' rebalance then evens them.
    for pipe in sorted(pipes, key=lambda q: -q["micro_batch_size"]):
        taken = left // pipe["micro_batch_size"]
        pipe["num_micro_batches"] += taken
        left -= taken * pipe["micro_batch_size"]
    return doc if left == 0 else None


def move_swap(space: Space, rng: random.Random, doc: PlanDict) -> PlanDict | None:
    """Two stages of different pipelines trade their GPUs (type, tp and all), keeping their
    layers: a way to change a pipeline's types when no GPU is idle."""
    pipes = doc["pipelines"]
    if len(pipes) < 2:
        return None
    p, q = rng.sample(range(len(pipes)), 2)
    s, t = rng.randrange(len(pipes[p]["stages"])), rng.randrange(len(pipes[q]["stages"]))
    a, b = pipes[p]["stages"][s], pipes[q]["stages"][t]
    if a["gpu_type"] == b["gpu_type"] and a["tp"] == b["tp"]:
        return None
    for key in ("gpu_type", "tp", "gpus"):
        a[key], b[key] = b[key], a[key]
    return doc


def move_copy(space: Space, rng: random.Random, doc: PlanDict) -> PlanDict | None:
    pipes = doc["pipelines"]
    p = rng.randrange(len(pipes))
    source = pipes[p]
    if source["num_micro_batches"] < 2:
        return None
    idle = space.idle(doc)
    stages = []
    for stage in source["stages"]:
        nodes = [n for n, free in idle.items()
                 if space.node_type[n] == stage["gpu_type"] and len(free) >= stage["tp"]]
        if not nodes:
            return None
        node = rng.choice(nodes)
        stages.append({"gpu_type": stage["gpu_type"], "tp": stage["tp"],
                       "gpus": [idle[node].pop() for _ in range(stage["tp"])],
                       "layers": list(stage["layers"])})
    half = source["num_micro_batches"] // 2
    source["num_micro_batches"] -= half
    pipes.append({"micro_batch_size": source["micro_batch_size"], "num_micro_batches": half,
                  "stages": stages})
    return doc


SIMPLE: dict[str, Move] = {
    "boundary": move_boundary, "micro-batches": move_micro_batches,
    "micro-batch size": move_micro_batch_size, "tp": move_tp, "split": move_split,
    "merge": move_merge, "relocate": move_relocate, "drop": move_drop, "copy": move_copy,
    "swap": move_swap,
}
FREEING = ("drop", "merge", "tp")


def move_compound(space: Space, rng: random.Random, doc: PlanDict) -> PlanDict | None:
    """GPUs set free by one move (a pipeline dropped, stages merged, a tp lowered) and put
    to work by two or three more: on a plan that uses every GPU, no single move that adds
    a stage or a pipeline has GPUs to place it on. A move that gives up part way keeps what
    it changed: any document the estimator finds valid is a plan worth judging."""
    moved = SIMPLE[rng.choice(FREEING)](space, rng, doc)
    for _ in range(rng.randint(2, 3)):
        if moved is None:
            return None
        name = rng.choice(("split", "relocate", "copy", "tp", "boundary", "micro-batch size",
                           "swap"))
        moved = SIMPLE[name](space, rng, moved) or moved
    return moved


MOVES = {**SIMPLE, "compound": move_compound}
REBALANCED = set(MOVES) - {"micro-batches"}
"""Moves followed by least-time batch shares: shares balance the pipelines' times, so a move
that speeds one shape up shortens the iteration only once the others take fewer samples."""
WEIGHTS = {"boundary": 4, "micro-batches": 3, "micro-batch size": 1, "tp": 1, "split": 1,
           "merge": 1, "relocate": 1, "drop": 1, "copy": 1, "swap": 1, "compound": 4}
PATIENCE = 300
"""Tries without a new best before the walk restarts from the best plan."""


def _as_dict(plan_doc: Plan) -> PlanDict:
    doc = json.loads(plan_doc.model_dump_json(exclude_none=True))
    doc.pop("estimate", None)
    return doc


def walk(scenario: Scenario, start: Plan, seconds: float, rng: random.Random,
         max_evaluations: int | None = None
         ) -> tuple[Plan, float, collections.Counter[str], int]:
    """The fastest plan the walk reaches from `start` in `seconds` (or `max_evaluations`),
    its iteration seconds, the moves behind each new best, and the number of evaluations."""
    space = Space(scenario)
    first = evaluate(scenario, start)
    assert first.valid and first.iteration_s is not None, first.errors
    best_doc, best_s = _as_dict(start), first.iteration_s
    current_doc, current_s = best_doc, best_s
    names = list(MOVES)
    weights = [WEIGHTS[n] for n in names]
    wins: collections.Counter[str] = collections.Counter()
    evaluations, since_best = 0, 0
    started = time.monotonic()
    while (elapsed := time.monotonic() - started) < seconds and (
            max_evaluations is None or evaluations < max_evaluations):
        temperature = 0.01 * (1 - elapsed / seconds)
        name = rng.choices(names, weights)[0]
        moved = MOVES[name](space, rng, copy.deepcopy(current_doc))
        if moved is None:
            continue
        try:
            candidate = parse_plan(moved)
        except Exception:  # noqa: BLE001 - a move may build a document the schema refuses
            continue
        evaluation = evaluate(scenario, candidate)
        evaluations += 1
        if name in REBALANCED and evaluation.iteration_s is not None:
            shared = rebalance(scenario, candidate, evaluation)
            if shared is not None:
                candidate, evaluation = shared, evaluate(scenario, shared)
                evaluations += 1
        since_best += 1
        if not evaluation.valid or evaluation.iteration_s is None:
            continue
        if evaluation.iteration_s < current_s * (1 + temperature * rng.random()):
            current_doc, current_s = _as_dict(candidate), evaluation.iteration_s
            if current_s < best_s * (1 - 1e-9):
                best_doc, best_s, since_best = current_doc, current_s, 0
                wins[name] += 1
        if since_best > PATIENCE:
            current_doc, current_s, since_best = best_doc, best_s, 0
    return parse_plan(best_doc), best_s, wins, evaluations


def inputs(sets: str, only: str | None, perturbed_count: int
           ) -> Iterator[tuple[str, dict[str, Any], Plan | None]]:
    """(name, scenario document, per-type reference plan or None) of every input walked:
    the shared sets, then the first `perturbed_count` perturbed ones (seed 0, as
    `bench/perturbed.py` draws them), which have no reference."""
    for set_name in filter(None, sets.split(",")):
        for path in SETS[set_name]:
            if only is None or only in path.stem:
                yield path.stem, json.loads(path.read_text()), parse_plan(json.loads(
                    (REFERENCE / f"{path.stem}.plan.json").read_text()))
    rng = random.Random(0)
    for k in range(perturbed_count):
        label, doc = perturbed(rng)
        yield f"perturbed #{k} ({label})", doc, None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0,
                        help="walk time per start plan and input")
    parser.add_argument("--sets", default="measured,generated",
                        help="shared sets, comma-separated (empty for none)")
    parser.add_argument("--only", default=None, help="only shared inputs whose name has this")
    parser.add_argument("--perturbed", type=int, default=0,
                        help="also the first N perturbed inputs, walked from hetplan's plan")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None,
                        help="write each plan the walk improved here")
    args = parser.parse_args()
    print(f"machine: {platform.machine()}, Python {platform.python_version()}, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {args.seconds:g} s per walk, "
          f"seed {args.seed}\n")
    print("| input | hetplan samples/s | walked from it | per-type reference | walked from it "
          "| best walked / hetplan | moves behind new bests | evaluations |")
    print("|---|---|---|---|---|---|---|---|")
    ratios = []
    for k, (name, doc, reference) in enumerate(inputs(args.sets, args.only, args.perturbed)):
        scenario = parse_scenario(doc)
        batch = scenario.job.global_batch_size
        searched = plan(scenario, SearchOptions(time_limit_s=10))
        starts = [(searched.plan, searched.evaluation.iteration_s or math.inf)]
        if reference is not None:
            starts.append((reference, evaluate(scenario, reference).iteration_s or math.inf))
        rng = random.Random(args.seed)
        row, all_wins, count = [], collections.Counter[str](), 0
        best_walked, best_plan = math.inf, searched.plan
        for start, start_s in starts:
            walked, walked_s, wins, evaluations = walk(scenario, start, args.seconds, rng)
            row += [f"{batch / start_s:.2f}", f"{batch / walked_s:.2f}"]
            all_wins.update(wins)
            count += evaluations
            if walked_s < best_walked:
                best_walked, best_plan = walked_s, walked
        row += ["", ""] * (2 - len(starts))
        ratio = (searched.evaluation.iteration_s or math.inf) / best_walked
        ratios.append(ratio)
        if args.out is not None and ratio > 1 + 1e-9:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / f"{k:03d}.walked.plan.json").write_text(
                best_plan.model_dump_json(indent=1, exclude_none=True))
        wins_text = ", ".join(f"{m} {v}" for m, v in all_wins.most_common()) or "none"
        print(f"| {name} | {' | '.join(row)} | {ratio:.4f} | {wins_text} | {count} |",
              flush=True)
    print(f"\n{len(ratios)} inputs: best walked / hetplan geometric mean {geomean(ratios):.4f}, "
          f"highest {max(ratios):.4f}")


if __name__ == "__main__":
    main()
