"""Judging candidates with the reference estimator: the finalists of least quick estimate
(and each family's best), the best few with their batch shares set by exact simulation,
the best of all polished by simulation (`refine.py`, `polish.py`)."""

from __future__ import annotations

import math
import time

from planner.documents import Scenario
from planner.estimate import Evaluation, evaluate
from planner.search.drafts import Candidate
from planner.search.polish import polish_plan
from planner.search.refine import rebalance

__all__ = ["BASELINE_FINALISTS", "FAMILY_FINALISTS", "Judged", "baseline_finalists", "finalists",
           "judge", "judge_group", "judged", "share_of_time_so_far", "worth_polishing",
           "worth_refining"]

REFINED = 3  # best finalists whose batch shares are then set by exact simulation
REFINE_SLACK = 1.05
"""Other drafts' best placements within this factor of the best time are refined too."""
BASELINE_FINALISTS = 4  # placed candidates of each baseline judged by the estimator
FAMILY_FINALISTS = 2
"""Candidates of each family (allocation, identical replicas, grids) judged whatever the
other families' quick estimates."""
QUICK_SLACK = 1.1
"""Finalists whose quick estimate exceeds the best simulated time by more are not judged."""
POLISH_SHARE = 0.5
"""Polishing the best plan's splits stops past this share of the search's time so far: a
guard for slow machines; its tries are counted (polish.py)."""
POLISH_MIN_S = 0.2
POLISH_RUNNER_UP = 1.01
"""A plan of another draft judged within this factor of the best is polished too..."""
RUNNER_UP_POLISHED_UP_TO_GPUS = 256
"""...on fleets of at most this many GPUs. On 400 held-out inputs its eight gains (0.04-0.71%)
were all on fewer than 128 GPUs; on the 512-GPU timing inputs it changed no plan and cost
the six-type input 7% of its planning time."""


Judged = list[tuple[Candidate, Evaluation | None]]
"""Candidates, best first by the quick estimate, with the estimator's verdict (None: not
judged, quoted too far above the best one judged before it)."""


def judge_group(scenario: Scenario, group: list[Candidate], limit: int,
                known: dict[int, Evaluation] | None = None) -> Judged:
    """Judge the `limit` candidates of least quick estimate, in that order."""
    verdicts: Judged = []
    best_s = math.inf
    for candidate in sorted(group, key=lambda c: c.quick_s)[:limit]:
        # The quick estimate is at most a few percent above the simulated time (it leaves
        # out pipeline bubbles): a finalist quoted far above the best so far cannot win.
        if candidate.quick_s > best_s * QUICK_SLACK:
            verdicts.append((candidate, None))
            continue
        evaluation = (known or {}).get(id(candidate)) or evaluate(scenario, candidate.plan)
        verdicts.append((candidate, evaluation))
        if evaluation.valid and evaluation.iteration_s is not None:
            best_s = min(best_s, evaluation.iteration_s)
    return verdicts


def judged(scenario: Scenario, group: list[Candidate],
           known: dict[int, Evaluation] | None = None) -> Judged:
    """A baseline's placed candidates, its best few judged by the estimator (`known`:
    evaluations computed before, by candidate id)."""
    return (judge_group(scenario, baseline_finalists(group), BASELINE_FINALISTS, known)
            + [(c, None) for c in sorted(group, key=lambda c: c.quick_s)[BASELINE_FINALISTS:]])


def baseline_finalists(group: list[Candidate]) -> list[Candidate]:
    """The candidates of a baseline that `judged` may evaluate, in its order (the search's
    wait evaluates these ahead of it)."""
    return sorted(group, key=lambda c: c.quick_s)[:BASELINE_FINALISTS]


def share_of_time_so_far(started: float, time_limit_s: float, share: float,
                         least_s: float) -> float:
    """A deadline `share` of the search's time so far from now (at least `least_s`), never
    past the time limit."""
    now = time.monotonic()
    return min(started + time_limit_s, now + max(least_s, share * (now - started)))


def finalists(candidates: list[Candidate], families: list[list[Candidate]], limit: int
              ) -> list[Candidate]:
    """The `limit` candidates of least quick estimate and, of each family, its best
    FAMILY_FINALISTS candidates and the best placement of each of its best FAMILY_FINALISTS
    drafts; least quick estimate first. The families' quick estimates err differently (a
    grid placed stage-major is quoted with its stages' transfers inside a node), and one
    family's optimistic quotes must not crowd out another's best. A family's best two
    candidates are often one draft placed both ways: its second draft is judged too."""
    chosen = {id(c): c for c in sorted(candidates, key=lambda c: c.quick_s)[:limit]}
    for family in families:
        drafts: set[int] = set()
        for rank, candidate in enumerate(sorted(family, key=lambda c: c.quick_s)):
            if rank >= FAMILY_FINALISTS and len(drafts) >= FAMILY_FINALISTS:
                break
            placed = _draft_of(candidate)
            if rank < FAMILY_FINALISTS or placed not in drafts:
                chosen.setdefault(id(candidate), candidate)
            drafts.add(placed)
    return sorted(chosen.values(), key=lambda c: c.quick_s)


def worth_refining(valid: list[tuple[float, Candidate, Evaluation]]
                   ) -> list[tuple[float, Candidate, Evaluation]]:
    """Of `valid` (iteration seconds, best first), the REFINED best and, of every other draft
    within REFINE_SLACK of the best, its best placement. The best few are often placements
    of one draft, and refined shares can reorder drafts judged close together: on a held-out
    two-zone input the draft that wins once refined was judged below three placements of
    two others."""
    chosen = valid[:REFINED]
    drafts = {_draft_of(c) for _, c, _ in chosen}
    for entry in valid[REFINED:]:
        if entry[0] > valid[0][0] * REFINE_SLACK:
            break
        if (placed := _draft_of(entry[1])) not in drafts:
            drafts.add(placed)
            chosen.append(entry)
    return chosen


def worth_polishing(valid: list[tuple[float, Candidate, Evaluation]], num_gpus: int
                    ) -> list[tuple[float, Candidate, Evaluation]]:
    """Of `valid` (best first), the best and, on a fleet of `num_gpus` up to
    RUNNER_UP_POLISHED_UP_TO_GPUS where a plan of another draft is within POLISH_RUNNER_UP
    of it, the best such plan: the polish climbs from one plan, and one a hair slower may
    climb higher (on a held-out two-zone input the best judged plan stayed at 0.8243 s
    while the runner-up polished to 0.8213 s). A plan whose shares were refined counts as a
    draft of its own, so the runner-up may be its draft's plan before refinement: counted
    as that draft instead, one held-out plan of 400 came out 0.06% slower, none faster."""
    best = valid[0]
    if num_gpus > RUNNER_UP_POLISHED_UP_TO_GPUS:
        return [best]
    for entry in valid[1:]:
        if entry[0] > best[0] * POLISH_RUNNER_UP:
            break
        if _draft_of(entry[1]) != _draft_of(best[1]):
            return [best, entry]
    return [best]


def _faster(evaluation: Evaluation, than: Evaluation) -> bool:
    return (evaluation.iteration_s is not None and than.iteration_s is not None
            and evaluation.iteration_s < than.iteration_s)


def _draft_of(candidate: Candidate) -> int:
    return id(candidate) if candidate.placement_of is None else candidate.placement_of


def judge(
    scenario: Scenario,
    candidates: list[Candidate],
    families: list[list[Candidate]],
    baselines: dict[str, Judged],
    *,
    limit: int,
    started: float,
    time_limit_s: float,
    known: dict[int, Evaluation] | None = None,
) -> tuple[Candidate | None, Evaluation | None, dict[str, float | None],
           list[tuple[Candidate, Evaluation]]]:
    """The best valid plan (its batch shares and split then refined), each baseline's rate,
    and the runners-up, best first. `known` holds candidates' evaluations computed before."""
    known = dict(known or {})
    known.update((id(c), e) for group in baselines.values() for c, e in group if e is not None)
    chosen = finalists(candidates, families, limit)
    judged_finalists = judge_group(scenario, chosen, len(chosen), known)
    valid: list[tuple[float, Candidate, Evaluation]] = []
    seen: set[int] = set()
    baseline_verdicts = [j for group in baselines.values() for j in group]
    for candidate, evaluation in judged_finalists + baseline_verdicts:
        if evaluation is None or id(candidate) in seen:
            continue
        seen.add(id(candidate))
        if evaluation.valid and evaluation.iteration_s is not None:
            valid.append((evaluation.iteration_s, candidate, evaluation))
    valid.sort(key=lambda v: v[0])
    for _, candidate, evaluation in worth_refining(valid):
        balanced = rebalance(scenario, candidate.plan, evaluation)
        if balanced is None:
            continue
        again = evaluate(scenario, balanced)
        if again.valid and again.iteration_s is not None:
            valid.append((again.iteration_s, Candidate.of(
                balanced, quick_s=again.iteration_s,
                origin=f"{candidate.origin}, exact batch shares"), again))
    best: Candidate | None = None
    best_eval: Evaluation | None = None
    if valid:
        valid.sort(key=lambda v: v[0])
        num_gpus = scenario.cluster.num_gpus
        for _, candidate, evaluation in worth_polishing(valid, num_gpus):
            # Each try evaluates the whole plan: never more than a share of the time so far.
            polished = polish_plan(
                scenario, candidate.plan, evaluation,
                deadline=share_of_time_so_far(started, time_limit_s, POLISH_SHARE,
                                              POLISH_MIN_S))
            if polished is not None:
                candidate = Candidate.of(
                    polished[0], quick_s=polished[1].iteration_s or candidate.quick_s,
                    origin=f"{candidate.origin}, polished by simulation")
                evaluation = polished[1]
            if best_eval is None or _faster(evaluation, best_eval):
                best, best_eval = candidate, evaluation
    # A baseline's rate counts its candidates judged among the finalists too.
    known.update((id(c), e) for c, e in judged_finalists if e is not None)
    rates: dict[str, float | None] = {}
    for name, group in baselines.items():
        values = [e.samples_per_s for c, _ in group
                  if (e := known.get(id(c))) is not None and e.valid and e.samples_per_s is not None]
        rates[name] = max(values, default=None)
    return best, best_eval, rates, [(c, e) for _, c, e in valid]
