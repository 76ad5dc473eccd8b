"""Exchanges: the best candidates' template sets with one template swapped for another of
the same kind, and the GPUs that frees put to work.

The allocation's linear model sees no sync, so among sets it rates within a fraction of a
percent of each other, which it returns is chance; its caps and subsets bring sync in
coarsely. A set the quick estimate ranks above every candidate can be one swap away from
the best of them: on sailor-gptneo2.7-a40x32-v16x32, eight pipelines of a V100 tp4 stage in
front of four A100 stages, each V100 stage made tp2 and the sixteen V100s this frees run
as two more pipelines of their own, are 2.9% faster once judged. Here every distinct template
of the best few candidates is swapped, in all its copies, for each of the templates of the
same micro-batch size and GPU classes whose GPUs are nearest its own (another split, other
tp per stage, a stage more or less) that fits where it stood; the GPUs left free on a class
are then filled with copies of that class's homogeneous templates whose copies run the most
samples/s there, or left idle. The best few drafts are placed; those quoted faster than
every candidate are judged as a family of their own, beside the finalists.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from planner.search.allocate import Row
from planner.search.drafts import Candidate, Draft, best_realized, draft
from planner.search.tables import ScenarioTables
from planner.search.templates import ClassKey, PipelineTemplate

__all__ = ["exchanged_candidates", "exchanged_drafts"]

EXCHANGED_FROM = 4
"""Candidates (distinct template sets, least quick estimate first) whose templates are
swapped."""
ALTERNATIVES = 6
"""Templates each template of a set is swapped for (those whose GPUs are nearest its own)."""
EXCHANGED_PLACED = 3
"""Exchanged drafts of least rough time that are placed (a family of finalists)."""
FILLERS = 2
"""Homogeneous templates per class tried on the GPUs a swap leaves free."""

_Kind = tuple[int, frozenset[ClassKey]]
_SetKey = frozenset[tuple[Any, int]]


def exchanged_candidates(tables: ScenarioTables, templates: Sequence[PipelineTemplate],
                         candidates: Sequence[Candidate]) -> list[Candidate]:
    """The best exchanged drafts placed, those the quick estimate puts ahead of every one of
    `candidates` (judging the others would cost time on large fleets for nothing expected)."""
    if not candidates:
        return []
    best_s = min(c.quick_s for c in candidates)
    placed = best_realized(tables, exchanged_drafts(tables, templates, candidates),
                           EXCHANGED_PLACED)
    return [c for c in placed if c.quick_s < best_s]


def exchanged_drafts(tables: ScenarioTables, templates: Sequence[PipelineTemplate],
                     candidates: Sequence[Candidate]) -> list[Draft]:
    """Drafts one swap (and a fill of the freed GPUs) away from the best candidates' sets."""
    levels = tables.resource_levels
    rows = tables.resource_rows
    sets = _best_sets(candidates)
    wanted = {_kind(t) for pipelines, _ in sets for t in pipelines}
    of_kind: dict[_Kind, list[PipelineTemplate]] = {}
    fillers: dict[ClassKey, list[PipelineTemplate]] = {}
    for t in templates:
        if _kind(t) in wanted:
            of_kind.setdefault(_kind(t), []).append(t)
        if len(t.gpus()) == 1:
            fillers.setdefault(t.stages[0].resource, []).append(t)
    out: list[Draft] = []
    seen: set[_SetKey] = set()
    for pipelines, origin in sets:
        copies = Counter(id(t) for t in pipelines)
        by_id = {id(t): t for t in pipelines}
        used = _usage(pipelines, levels)
        for tid, count in copies.items():
            old = by_id[tid]
            for new in _nearest(old, of_kind.get(_kind(old), [])):
                swapped = [new if id(t) == tid else t for t in pipelines]
                after = used.copy()
                after.subtract({row: n * count for row, n in old.usage(levels).items()})
                after.update({row: n * count for row, n in new.usage(levels).items()})
                free = {row: capacity - after[row] for row, capacity in rows.items()}
                if any(n < 0 for n in free.values()):
                    continue  # the new template does not fit where the old one stood
                freed = {k for k, n in old.gpus().items() if new.gpus().get(k, 0) < n}
                for added in _fills(free, freed, fillers, levels):
                    key = _set_key(swapped + added)
                    if key in seen:
                        continue
                    seen.add(key)
                    made = draft(tables, swapped + added, f"{origin}, exchanged")
                    if made is not None:
                        out.append(made)
    return out


def _nearest(old: PipelineTemplate, kind: Sequence[PipelineTemplate]) -> list[PipelineTemplate]:
    """The ALTERNATIVES templates of `old`'s kind whose GPUs are nearest its own but not the
    same (a stage narrower or wider, a stage more or less: another split of the same GPUs
    frees none, and the templates keep few of those), faster first among equals."""
    gpus = old.gpus()
    distance = {id(t): sum(abs(t.gpus().get(k, 0) - n) for k, n in gpus.items()) for t in kind}
    return sorted((t for t in kind if distance[id(t)] > 0),
                  key=lambda t: (distance[id(t)], t.bottleneck_s / t.micro_batch))[:ALTERNATIVES]


def _best_sets(candidates: Sequence[Candidate]) -> list[tuple[tuple[PipelineTemplate, ...], str]]:
    """The template sets of the EXCHANGED_FROM best candidates that have one, distinct."""
    sets: list[tuple[tuple[PipelineTemplate, ...], str]] = []
    seen: set[_SetKey] = set()
    for candidate in sorted(candidates, key=lambda c: c.quick_s):
        if not candidate.pipelines:
            continue
        key = _set_key(candidate.pipelines)
        if key in seen:
            continue
        seen.add(key)
        sets.append((candidate.pipelines, candidate.origin.partition(",")[0]))
        if len(sets) == EXCHANGED_FROM:
            break
    return sets


def _kind(t: PipelineTemplate) -> _Kind:
    """What a swap keeps: the micro-batch size and the classes the stages run on."""
    return t.micro_batch, frozenset(t.gpus())


def _set_key(pipelines: Sequence[PipelineTemplate]) -> _SetKey:
    """Equal for sets of equal templates, whichever step built them (grids build their own)."""
    return frozenset(Counter(t.signature for t in pipelines).items())


def _usage(pipelines: Sequence[PipelineTemplate], levels: dict[ClassKey, tuple[int, ...]]
           ) -> Counter[Row]:
    used: Counter[Row] = Counter()
    for t in pipelines:
        used.update(t.usage(levels))
    return used


def _fills(free: dict[Row, int], freed: set[ClassKey],
           fillers: dict[ClassKey, list[PipelineTemplate]],
           levels: dict[ClassKey, tuple[int, ...]]) -> list[list[PipelineTemplate]]:
    """Nothing added, and for each class the swap `freed` GPUs of, the copies of its
    homogeneous templates that fit there, of the FILLERS templates whose copies run the
    most samples/s (most per GPU would favour a small template that leaves GPUs over)."""
    options: list[list[PipelineTemplate]] = [[]]
    for key in sorted(freed, key=lambda k: (k[0], k[1] or "")):  # zones may be None
        group = fillers.get(key, [])
        fitting = []
        for filler in group:
            fit = min(free[row] // n for row, n in filler.usage(levels).items() if n > 0)
            if fit > 0:
                fitting.append((fit * filler.micro_batch / filler.bottleneck_s, fit, filler))
        fitting.sort(key=lambda f: -f[0])
        options += [[filler] * fit for _, fit, filler in fitting[:FILLERS]]
    return options
