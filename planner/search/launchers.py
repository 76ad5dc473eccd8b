"""The best plan a named launcher can run (`SearchOptions.launcher`).

Megatron-LM, DeepSpeed and torchtitan run one grid: identical pipeline
replicas (one depth, tp, split and micro-batch size, the same share each).
The search's own plans are often not of that form, so beside its candidates
and the baselines this step offers identical replicas of every template, at
every count that divides the batch evenly, and keeps only what the launcher's
export accepts (`planner.export.expressible`), judged by the estimator. Every
search offers identical replicas too, at any count (shares of the batch differing
by one micro-batch where the count does not divide it), as what the allocation's
linear model may miss.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator, Sequence

from planner.documents import Plan, Scenario
from planner.errors import Infeasible
from planner.estimate import Evaluation, evaluate
from planner.search.drafts import ROUGH_SLACK, Candidate, Draft, best_realized, replicas_draft
from planner.search.tables import ScenarioTables
from planner.search.templates import PipelineTemplate

__all__ = ["check_launcher", "launcher_candidates", "best_for_launcher"]

GRID_DRAFTS = 6
"""Identical-replica drafts, least rough time first, placed and offered to every search."""
LAUNCHER_GRID_DRAFTS = 64
"""The same, when the plan must be one a named launcher runs (most of them are)."""


def check_launcher(launcher: str) -> None:
    from planner.export import FORMATS  # loaded only when a launcher is named (_refusals)

    if launcher not in FORMATS:
        raise ValueError(f"unknown launcher {launcher!r}; use one of {sorted(FORMATS)}")


def launcher_candidates(tables: ScenarioTables, templates: Sequence[PipelineTemplate],
                        keep: int = GRID_DRAFTS, *, slack: float = ROUGH_SLACK,
                        even: bool = True) -> list[Candidate]:
    """Identical replicas of each template, placed, best first by the quick estimate; those
    quoted more than `slack` times the best are not placed (for a named launcher every grid
    counts, however far behind the best plan it is: `math.inf`). With `even` False, counts
    that do not divide the batch are offered too, their shares water-filled."""
    return best_realized(tables, _grid_drafts(tables, templates, keep, even), keep, slack)


def _grid_drafts(tables: ScenarioTables, templates: Sequence[PipelineTemplate], keep: int,
                 even: bool) -> Iterator[Draft | None]:
    """Drafts of the `keep` replica sets of least rough time (the time of the pipelines with
    the most micro-batches plus the template's own sync estimate; ties in the order offered),
    ranked before any draft is built. Fewer replicas only lengthen each pipeline, so a
    template's counts are taken most first, and the first whose pipeline time alone is out
    of the running ends them: at thousands of GPUs a template has hundreds of counts."""
    batch = tables.scenario.job.global_batch_size
    sizes = {c.key: c.num_gpus for c in tables.classes}
    kept: list[tuple[float, int, int, PipelineTemplate]] = []  # a max-heap, negated
    offered = 0
    for template in templates:
        most = min(sizes[key] // used for key, used in template.gpus().items())
        micro_batches = batch // template.micro_batch  # over all the replicas
        if batch % template.micro_batch:
            continue
        for count in range(min(most, micro_batches), 0, -1):
            if even and micro_batches % count:
                continue
            m = -(-micro_batches // count)
            if template.max_micro_batches is not None and m > template.max_micro_batches:
                continue
            pipeline_s = template.time_s(m)
            if len(kept) == keep and pipeline_s >= -kept[0][0]:
                break
            rough = pipeline_s + template.sync_s(count)
            offered += 1
            entry = (-rough, -offered, count, template)
            if len(kept) < keep:
                heapq.heappush(kept, entry)
            elif entry > kept[0]:
                heapq.heapreplace(kept, entry)
    for _, _, count, template in sorted(kept, reverse=True):
        yield replicas_draft(tables, template, count, "identical pipelines")


def _refusals(scenario: Scenario, launcher: str) -> Callable[[Plan], str | None]:
    """Why the launcher format cannot run a plan under `scenario`'s options (None: it can);
    the options are read once."""
    # The exports load only for searches that name a launcher (a one-shot `hetplan plan`
    # pays every import).
    from planner.export import expressible, format_options, scenario_options

    known = format_options(launcher)
    options = {k: v for k, v in scenario_options(scenario).items() if k in known}
    return lambda plan: expressible(plan, launcher, **options)


def runnable_by(scenario: Scenario, launcher: str, plan: Plan) -> bool:
    """Whether the launcher format can run `plan` (interleaving or local learning, say,
    are beyond some)."""
    return _refusals(scenario, launcher)(plan) is None


def best_for_launcher(
    scenario: Scenario, launcher: str, candidates: Sequence[Candidate], finalists: int
) -> tuple[Candidate, Evaluation]:
    """The candidate of least simulated time that the launcher can run. Infeasible, with
    the best candidate's reasons, when it can run none."""
    refusals = _refusals(scenario, launcher)
    runnable: list[Candidate] = []
    refusal = None
    for candidate in sorted(candidates, key=lambda c: c.quick_s):
        reasons = refusals(candidate.plan)
        if reasons is None:
            runnable.append(candidate)
            if len(runnable) >= finalists:
                break
        elif refusal is None:
            refusal = reasons
    best: tuple[Candidate, Evaluation] | None = None
    for candidate in runnable:
        judged = evaluate(scenario, candidate.plan)
        if judged.valid and judged.iteration_s is not None and (
                best is None or judged.iteration_s < (best[1].iteration_s or float("inf"))):
            best = (candidate, judged)
    if best is None:
        raise Infeasible(f"no plan found that {launcher} can run; the best plan's refusal: "
                         f"{refusal or 'no valid plan'}")
    candidate, judged = best
    return (Candidate.of(candidate.plan, quick_s=judged.iteration_s or candidate.quick_s,
                         origin=f"{candidate.origin}, restricted to what {launcher} runs"),
            judged)
