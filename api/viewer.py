"""The plan viewer: one HTML page per plan (or two side by side), drawn with plotly, and
the cost/throughput chart of a set of plans (a Pareto frontier).

For a plan and its scenario it shows the pipeline timeline of every distinct pipeline
(forwards, backwards, recomputation, local heads, transfers, bubbles, gradient sync) from
the event simulation, memory per stage against capacity, the idle GPUs and why, the
baselines, and the cost where every used GPU type has a price. The frontier page draws
samples/s against USD/hour, each point a link to its plan's page. Pages load plotly.js
from `plotly_src`: the service serves the copy the plotly package ships; `hetplan show`
and `hetplan pareto --html` inline it. Nothing comes from the internet.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from planner.documents import Plan, Scenario
from planner.estimate import Evaluation, PipelineEstimate, dominates, evaluate
from planner.timeline import pipeline_timeline

__all__ = ["PlanView", "ChartPoint", "chart_point", "plan_page", "compare_page",
           "frontier_page", "plotly_js_dir", "PLOTLY_FILE"]

PLOTLY_FILE = "plotly.min.js"
COLOURS = {"forward": "#4c78a8", "backward": "#f58518", "recompute": "#e45756",
           "head": "#eeca3b", "transfer": "#72b7b2", "bubble": "#e5e5e5", "sync": "#b279a2"}


@dataclass(frozen=True, kw_only=True)
class PlanView:
    """What the page shows about one plan, wherever it came from."""

    title: str
    scenario: Scenario
    plan: Plan
    status: str | None = None
    baselines_samples_per_s: dict[str, float | None] = field(default_factory=dict)
    unused_gpus: dict[str, str] = field(default_factory=dict)
    """Why the search left GPUs idle, where it said (stored plans); the page lists every
    GPU of the cluster the plan does not use, with this reason when there is one."""


@dataclass(frozen=True, kw_only=True)
class ChartPoint:
    """One plan on the cost/throughput chart, and the page clicking it opens."""

    title: str
    href: str
    """Where the point and its row link to: a plan's page, or an anchor in this page."""
    samples_per_s: float | None
    usd_per_hour: float | None
    """None when a GPU type the plan uses has no price: the point is listed, not drawn."""
    usd_per_million_tokens: float | None = None
    fleet: str | None = None
    """The GPU types and nodes the plan was searched on (frontier points say so)."""


def chart_point(view: PlanView, href: str) -> ChartPoint:
    """A plan's point: its throughput and price as the plan's own page shows them."""
    evaluation = evaluate(view.scenario, view.plan)
    search = getattr(view.plan, "search", None) or {}
    return ChartPoint(title=view.title, href=href, samples_per_s=evaluation.samples_per_s,
                      usd_per_hour=evaluation.usd_per_hour,
                      usd_per_million_tokens=evaluation.usd_per_million_tokens,
                      fleet=search.get("fleet") if isinstance(search, dict) else None)


def plotly_js_dir() -> str:
    """The folder holding the plotly.js the plotly package ships."""
    from importlib.resources import files

    return str(files("plotly") / "package_data")


def plan_page(view: PlanView, *, plotly_src: str | None) -> str:
    """A whole HTML page for one plan; `plotly_src` None inlines plotly.js."""
    return _page(view.title, [_section(view, "plan", heading=False)], plotly_src=plotly_src,
                 columns=1)


def compare_page(a: PlanView, b: PlanView, *, plotly_src: str | None) -> str:
    """Two plans side by side, with a table of their numbers first."""
    evaluations = evaluate(a.scenario, a.plan), evaluate(b.scenario, b.plan)
    table = _comparison_table([a, b], list(evaluations))
    return _page(f"{a.title} vs {b.title}", [_section(a, "a"), _section(b, "b")],
                 plotly_src=plotly_src, columns=2, before=table)


def frontier_page(title: str, points: Sequence[ChartPoint], *, plotly_src: str | None,
                  views: Sequence[PlanView] = ()) -> str:
    """The chart of `points` (samples/s against USD/hour, the points no other dominates
    joined as the frontier), clicking a point opening its `href`, and a table of the
    same links. `views` are drawn below, each in a section whose id is `point-<n>`, for a
    page that holds its plans itself (hrefs `#point-<n>`)."""
    chart = _figure_html(_frontier_figure(points), "frontier", "frontier",
                         post_script=CLICK_TO_OPEN)
    sections = [f"<div id='point-{n}'>{_section(view, f'point-{n}')}</div>"
                for n, view in enumerate(views)]
    return _page(title, sections, plotly_src=plotly_src, columns=1,
                 before=chart + _points_table(points))


CLICK_TO_OPEN = """document.getElementById('{plot_id}').on('plotly_click', function (event) {
  var point = event.points[0];
  if (point && point.customdata) { window.location.href = point.customdata[0]; }
});"""
"""plotly's click event: open the clicked point's page (`customdata[0]` is its href)."""


def _on_frontier(points: Sequence[ChartPoint]) -> list[bool]:
    priced = [p for p in points if p.samples_per_s is not None and p.usd_per_hour is not None]
    return [p in priced and not any(dominates(q, p) for q in priced) for p in points]


def _frontier_figure(points: Sequence[ChartPoint]) -> Any:
    import plotly.graph_objects as go

    on = _on_frontier(points)
    traces = []
    for name, keep, style in (("frontier", True, {"color": "#4c78a8", "size": 12}),
                              ("dominated", False, {"color": "#9d9d9d", "size": 10})):
        shown = sorted((p for p, f in zip(points, on, strict=True)
                        if f is keep and p.usd_per_hour is not None
                        and p.samples_per_s is not None),
                       key=lambda p: (p.usd_per_hour, p.samples_per_s))
        if not shown:
            continue
        traces.append(go.Scatter(
            name=name, x=[p.usd_per_hour for p in shown], y=[p.samples_per_s for p in shown],
            mode="lines+markers" if keep else "markers", line={"shape": "hv", "dash": "dot"},
            marker=style, customdata=[[p.href, p.title, p.fleet or ""] for p in shown],
            hovertemplate="%{customdata[1]}<br>%{customdata[2]}<br>%{y:.2f} samples/s at "
                          "$%{x:.2f}/hour<br>click to open<extra></extra>"))
    figure = go.Figure(traces)
    figure.update_layout(title="samples/s against USD/hour (click a point to open its plan)",
                         xaxis_title="USD per hour", yaxis_title="samples/s", height=480,
                         hovermode="closest", clickmode="event", dragmode=False,
                         margin={"l": 10, "r": 10})
    return figure


def _points_table(points: Sequence[ChartPoint]) -> str:
    on = _on_frontier(points)
    rows = [[p.title, p.fleet or "",
             "invalid plan" if p.samples_per_s is None else f"{p.samples_per_s:.2f}",
             "no price" if p.usd_per_hour is None else f"{p.usd_per_hour:.2f}",
             "" if p.usd_per_million_tokens is None else f"{p.usd_per_million_tokens:.4f}",
             "yes" if f else "no"] for p, f in zip(points, on, strict=True)]
    return _table(["plan", "fleet", "samples/s", "USD/hour", "USD per million tokens",
                   "frontier"], rows, links=[p.href for p in points])


# -- the numbers ---------------------------------------------------------------------------

def _numbers(view: PlanView, evaluation: Evaluation) -> list[tuple[str, str]]:
    rows = [("status", view.status or ("valid" if evaluation.valid else "invalid")),
            ("GPUs used", str(sum(len(s.gpus) for p in view.plan.pipelines for s in p.stages))),
            ("pipelines", str(len(view.plan.pipelines)))]
    if evaluation.iteration_s is not None:
        rows += [("iteration", f"{evaluation.iteration_s:.4f} s"),
                 ("gradient sync", f"{evaluation.sync_s or 0.0:.4f} s"),
                 ("samples/s", f"{evaluation.samples_per_s:.2f}"),
                 ("tokens/s", f"{evaluation.tokens_per_s:.0f}")]
    if evaluation.efficiency is not None:
        rows.append(("efficiency (compute bound / iteration)", f"{evaluation.efficiency:.1%}"))
    # The estimator's price (section 7), the same number the frontier chart draws.
    usd, per_million = evaluation.usd_per_hour, evaluation.usd_per_million_tokens
    if usd is not None and per_million is not None:
        rows += [("cost per hour", f"${usd:.2f}"),
                 ("cost per million tokens", f"${per_million:.4f}")]
    elif evaluation.iteration_s is not None:
        rows.append(("cost", "unknown: a GPU type the plan uses has no hourly_usd"))
    return rows


def _distinct(pipelines: Sequence[PipelineEstimate]) -> list[tuple[PipelineEstimate, int]]:
    """Pipelines of different shape or times, each with how many replicas share it."""
    seen: dict[tuple[Any, ...], list[Any]] = {}
    for p in pipelines:
        key = (p.micro_batch_size, p.num_micro_batches, p.schedule, tuple(
            (s.gpu_type, s.tp, tuple(map(tuple, _ranges(s))), s.effective_forward_ms,
             s.effective_backward_ms)
            for s in p.stages))
        seen.setdefault(key, [p, 0])[1] += 1
    return [(p, count) for p, count in seen.values()]


# -- the figures ---------------------------------------------------------------------------

def _ranges(stage: Any) -> list[list[int]]:
    """A stage's layer ranges: its chunks under interleaving, else its one range."""
    return list(getattr(stage, "chunks", None) or [stage.layers or []])


def _stage_label(pipeline: PipelineEstimate, s: int) -> str:
    stage = pipeline.stages[s]
    shown = "+".join(f"[{r[0]},{r[1]})" for r in _ranges(stage))
    return f"stage {s}: {stage.gpu_type} tp{stage.tp} {shown}"


def _timeline_figure(pipeline: PipelineEstimate, replicas: int, sync_end_s: float,
                     iteration_start_sync_s: float) -> Any:
    import plotly.graph_objects as go

    spans = pipeline_timeline(pipeline)
    bars: dict[str, tuple[list[float], list[float], list[str], list[str]]] = {
        k: ([], [], [], []) for k in COLOURS}

    def add(kind: str, s: int, start: float, end: float, what: str = "") -> None:
        if end > start:
            base, width, label, text = bars[kind]
            base.append(start)
            width.append(end - start)
            label.append(_stage_label(pipeline, s))
            text.append(what)

    for span in spans:
        chunk = f", chunk {span.chunk}" if pipeline.num_chunks > 1 else ""
        add(span.phase.value, span.stage, span.start_s, span.end_s,
            f"micro-batch {span.micro_batch}{chunk}: ")
    for s in range(pipeline.num_stages):
        busy = sorted((x.start_s, x.end_s) for x in spans if x.stage == s)
        cursor = 0.0
        for start, end in busy:
            add("bubble", s, cursor, start)
            cursor = max(cursor, end)
        add("bubble", s, cursor, iteration_start_sync_s)
        add("sync", s, iteration_start_sync_s,
            iteration_start_sync_s + pipeline.stages[s].sync_s)
    figure = go.Figure([go.Bar(name=kind, base=base, x=width, y=label, orientation="h",
                               # A thin white edge parts back-to-back operations.
                               marker={"color": COLOURS[kind],
                                       "line": {"color": "white", "width": 0.5}},
                               customdata=text,
                               hovertemplate="%{customdata}%{base:.4f} s + %{x:.4f} s")
                        for kind, (base, width, label, text) in bars.items() if base])
    rows = [_stage_label(pipeline, s) for s in range(pipeline.num_stages)]
    figure.update_layout(
        barmode="overlay", height=200 + 60 * pipeline.num_stages, xaxis_title="seconds",
        legend={"orientation": "h", "y": -0.25 - 0.5 / pipeline.num_stages},
        title=f"pipeline {pipeline.index} (x{replicas}): micro-batch {pipeline.micro_batch_size}"
              f" x {pipeline.num_micro_batches}, {pipeline.schedule}, T_p {pipeline.T_p:.4f} s",
        yaxis={"categoryorder": "array", "categoryarray": rows[::-1]},
        xaxis={"range": [0, max(sync_end_s, pipeline.T_p)]}, margin={"l": 10, "r": 10})
    return figure


def _memory_figure(distinct: list[tuple[PipelineEstimate, int]]) -> Any:
    import plotly.graph_objects as go

    labels, state, acts, reserved, capacity = [], [], [], [], []
    for p, _ in distinct:
        for s, stage in enumerate(p.stages):
            labels.append(f"p{p.index} s{s} {stage.gpu_type}")
            state.append(stage.state_bytes / 2**30)
            acts.append(stage.activation_bytes / 2**30)
            reserved.append(stage.reserved_gib)
            capacity.append(stage.capacity_gib)
    figure = go.Figure([
        go.Bar(name="weights, grads, optimizer", x=labels, y=state),
        go.Bar(name="activations in flight", x=labels, y=acts),
        go.Bar(name="reserved", x=labels, y=reserved),
        go.Scatter(name="capacity", x=labels, y=capacity, mode="markers",
                   marker={"symbol": "line-ew-open", "size": 28, "color": "#d62728"}),
    ])
    figure.update_layout(barmode="stack", title="memory per GPU of each stage (GiB)",
                         yaxis_title="GiB", height=380, margin={"l": 10, "r": 10})
    return figure


def _baselines_figure(view: PlanView, evaluation: Evaluation) -> Any:
    import plotly.graph_objects as go

    names = ["this plan", *view.baselines_samples_per_s]
    rates = [evaluation.samples_per_s or 0.0,
             *[r or 0.0 for r in view.baselines_samples_per_s.values()]]
    figure = go.Figure([go.Bar(x=names, y=rates, marker_color=["#54a24b"] + ["#9d9d9d"] *
                               len(view.baselines_samples_per_s))])
    figure.update_layout(title="samples/s against the baselines", yaxis_title="samples/s",
                         height=320, margin={"l": 10, "r": 10})
    return figure


# -- the page ------------------------------------------------------------------------------

def _section(view: PlanView, key: str, *, heading: bool = True) -> str:
    evaluation = evaluate(view.scenario, view.plan)
    parts = [f"<h2>{html.escape(view.title)}</h2>" if heading else "",
             _table(["", ""], _numbers(view, evaluation))]
    if not evaluation.valid:
        errors = "".join(f"<li>{html.escape(e)}</li>" for e in evaluation.errors)
        return "".join(parts) + f"<p class='invalid'>invalid plan:</p><ul>{errors}</ul>"
    distinct = _distinct(evaluation.pipelines)
    iteration_s = evaluation.iteration_s or 0.0
    sync_start = iteration_s - (evaluation.sync_s or 0.0)
    parts.append(f"<h3>pipeline timelines ({len(distinct)} distinct of "
                 f"{len(evaluation.pipelines)})</h3>")
    for n, (pipeline, replicas) in enumerate(distinct):
        figure = _timeline_figure(pipeline, replicas, iteration_s, sync_start)
        parts.append(_figure_html(figure, f"{key}-timeline-{n}", "timeline"))
    parts.append(_figure_html(_memory_figure(distinct), f"{key}-memory", "memory"))
    if view.baselines_samples_per_s:
        parts.append(_figure_html(_baselines_figure(view, evaluation), f"{key}-baselines",
                                  "baselines"))
    idle = _idle_gpus(view)
    parts.append(f"<h3>idle GPUs ({len(idle)})</h3>")
    parts.append(_table(["GPU", "why idle"], sorted(idle.items()))
                 if idle else "<p>none: every GPU of the cluster is used</p>")
    return "".join(parts)


def _idle_gpus(view: PlanView) -> dict[str, str]:
    used = {g for p in view.plan.pipelines for s in p.stages for g in s.gpus}
    names = (f"{node.name}:{i}" for node in view.scenario.cluster.nodes for i in range(node.gpus))
    return {name: view.unused_gpus.get(name, "not in the plan (no reason recorded with it)")
            for name in names if name not in used}


def _comparison_table(views: list[PlanView], evaluations: list[Evaluation]) -> str:
    columns = [_numbers(v, e) for v, e in zip(views, evaluations, strict=True)]
    names = [name for name, _ in columns[0]]
    rows = [(name, *[dict(c).get(name, "") for c in columns]) for name in names]
    return _table(["", *[v.title for v in views]], rows)


def _figure_html(figure: Any, div_id: str, kind: str, *, post_script: str | None = None) -> str:
    body = figure.to_html(full_html=False, include_plotlyjs=False, div_id=div_id,
                          config={"displaylogo": False}, post_script=post_script)
    return f"<div class='figure' data-kind='{kind}'>{body}</div>"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], *,
           links: Sequence[str] | None = None) -> str:
    """`links`, when given: one href per row, for its first cell."""
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)

    def cell(c: object, n: int, r: int) -> str:
        text = html.escape(str(c))
        if n == 0 and links is not None:
            text = f"<a href='{html.escape(links[r])}'>{text}</a>"
        return f"<td>{text}</td>"

    body = "".join("<tr>" + "".join(cell(c, n, r) for n, c in enumerate(row)) + "</tr>"
                   for r, row in enumerate(rows))
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _page(title: str, sections: list[str], *, plotly_src: str | None, columns: int,
          before: str = "") -> str:
    if plotly_src is None:
        from plotly.offline import get_plotlyjs

        script = f"<script>{get_plotlyjs()}</script>"
    else:
        script = f"<script src='{html.escape(plotly_src)}'></script>"
    cells = "".join(f"<section>{s}</section>" for s in sections)
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}"
            f"</title>{script}<style>{_STYLE}</style></head><body><h1>{html.escape(title)}</h1>"
            f"{before}<div class='grid' style='grid-template-columns: repeat({columns}, 1fr)'>"
            f"{cells}</div></body></html>")


_STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #222; }
.grid { display: grid; gap: 2em; }
table { border-collapse: collapse; margin: 0.5em 0 1em; }
td, th { border-bottom: 1px solid #ddd; padding: 0.25em 0.8em; text-align: left; }
.invalid { color: #b00; font-weight: bold; }
"""
