"""The run's human-facing artefacts: ``summary.md``, ``plots/*.png`` and a self-contained ``report.html``.

:func:`render_html` is pure (tables and PNG bytes in, HTML text out); the
page needs nothing but itself: CSS inline, plots embedded as base64 PNG,
per-trial timelines as inline SVG. :func:`write_all` and :func:`build` hand
every file to :class:`cutbench.harness.store.rundir.RunDir`, the only writer of results.

The page checks itself when it loads: every ``<img>`` decoded, every table
has rows, every timeline has marks. It then sets ``data-render-check`` on
``<body>`` to ``ok`` (or ``failed`` with the problems listed), so a headless
browser can verify a report without looking at pixels.
"""

from __future__ import annotations

import base64
import datetime as _dt
import html
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
from matplotlib.colors import to_rgb

from cutbench import storage
from cutbench.harness.checker.stats import certificate_matrix
from cutbench.harness.reports import plots
from cutbench.harness.reports.explain import explain, parse_findings, resume_flag, sender_of
from cutbench.harness.reports import summary
from cutbench.harness.store.rundir import RunDir

MAX_TIMELINES = 60  # per-trial timelines drawn: every failing trial first, then one per arm, then the rest
MAX_TRIAL_ROWS = 2000  # rows of the all-trials table
# The environment variable that turns the PNG plots off (see write_all).
PLOTS_ENV = "CUTBENCH_PLOTS"
MAX_SKIPPED_LINES = 40  # skipped arms listed (a matrix on a CPU machine skips hundreds)

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Helvetica,Arial,sans-serif;margin:0;color:#1d1d1f;background:#fafafa}
main{max-width:1180px;margin:0 auto;padding:0 20px 40px;overflow-wrap:break-word}
h1{font-size:22px;margin:22px 0 6px}h2{font-size:18px;margin:28px 0 8px;border-bottom:1px solid #ddd;padding-bottom:4px}
.banner{padding:16px 20px;color:#fff;font-size:18px}.banner small{display:block;font-size:14px;opacity:.92;margin-top:4px}
.banner.invalid{background:#b3261e}.banner.valid{background:#1e7b34}.banner.unknown,.banner.empty{background:#9a6700}.banner.partial{background:#4a4f57}
.partial{display:inline-block;background:#fff3;border:1px solid #fff8;border-radius:4px;padding:0 6px;margin-left:8px;font-size:13px}
.table-wrap{max-width:100%;overflow-x:auto;margin:8px 0 14px}
table{border-collapse:collapse;background:#fff;font-size:13px}
th,td{border:1px solid #ddd;padding:3px 7px;text-align:left;vertical-align:top}th{background:#f0f0f0}
td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
tr.o-invalid td.outcome{color:#b3261e;font-weight:600}tr.o-unknown td.outcome{color:#9a6700;font-weight:600}
tr.o-valid td.outcome{color:#1e7b34}tr.o-refused td.outcome{color:#555}
figure{margin:10px 0 22px;background:#fff;border:1px solid #e3e3e3;padding:10px;display:inline-block;max-width:100%}
figure img{max-width:100%;height:auto;display:block}figcaption{color:#555;font-size:13px;margin-top:6px}
code{background:#f0f0f0;padding:1px 4px;border-radius:3px;font-size:12px}
details{margin:6px 0;background:#fff;border:1px solid #e3e3e3;padding:6px 10px}summary{cursor:pointer}
.muted{color:#666}.kv td:first-child{font-weight:600}
svg.timeline{max-width:100%;height:auto;display:block}svg.timeline text{font:11px system-ui,sans-serif}
table.sticky-first td:first-child,table.sticky-first th:first-child{position:sticky;left:0;z-index:1;box-shadow:inset -1px 0 #bbb}
table.sticky-first td:first-child{background:#fff}
"""

# Colours of the per-trial timeline: stages take theirs from plots.stage_colours (shared with the stage-time plot).
_FAILED_COLOUR = "#e15759"  # the outline of a failed or refused stage
_EFFECT_COLOURS = {"first": "#2e9d4a", "again": "#d62728", "suppressed": "#9e9e9e", "other": "#1f77b4"}
_EFFECT_NAMES = {"first": "first application", "again": "applied again", "suppressed": "suppressed", "other": "other delivery"}
_CHAR_PX = 6.5  # width of one character of the timeline's 11 px text (DejaVu Sans averages 6.2), so labels do not overrun

_CHECK_JS = """
window.addEventListener("load", function () {
  var problems = [];
  var imgs = document.querySelectorAll("img"), imgOk = 0;
  imgs.forEach(function (im) {
    if (im.complete && im.naturalWidth > 0) { imgOk++; } else { problems.push("image not decoded: " + im.alt); }
  });
  var tables = document.querySelectorAll("table"), tabOk = 0;
  tables.forEach(function (t) {
    var hidden = t.closest("details:not([open])") !== null;
    if (t.tBodies.length && t.tBodies[0].rows.length > 0 && (hidden || t.getBoundingClientRect().height > 0)) { tabOk++; }
    else { problems.push("table empty: " + t.id); }
  });
  var svgs = document.querySelectorAll("svg.timeline"), svgOk = 0;
  svgs.forEach(function (s) {
    if (s.querySelectorAll("rect.stage").length > 0) { svgOk++; } else { problems.push("timeline empty: " + s.id); }
  });
  var b = document.body;
  b.setAttribute("data-images", imgOk + "/" + imgs.length);
  b.setAttribute("data-tables", tabOk + "/" + tables.length);
  b.setAttribute("data-timelines", svgOk + "/" + svgs.length);
  b.setAttribute("data-problems", problems.join("; "));
  b.setAttribute("data-render-check", problems.length ? "failed" : "ok");
});
"""


@dataclass(frozen=True)
class ReportFiles:
    """Where :func:`write_all` put the artefacts."""

    summary: Path
    report: Path
    plots: dict[str, Path]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (paths as strings)."""
        return {"summary": str(self.summary), "report": str(self.report), "plots": {k: str(v) for k, v in self.plots.items()}}


def write_all(run: RunDir, meta: dict[str, Any], trials: pd.DataFrame, timeline: pd.DataFrame, effects: pd.DataFrame,
              criteria: pd.DataFrame | None = None, matrix: pd.DataFrame | None = None,
              deviations: pd.DataFrame | None = None) -> ReportFiles:
    """Write ``summary.md``, ``plots/<name>.png`` and ``report.html`` for a run; return their paths.

    ``criteria`` (the table ``cutbench criteria`` stored) adds the criteria
    section and its plots (``plots/criteria_<criterion>.png``); ``matrix``
    (``cutbench matrix``'s table) the support-matrix section, and ``deviations``
    (``cutbench matrix --findings``) its table of the tools' lifecycle deviations.

    With ``CUTBENCH_PLOTS=0`` in the environment no PNG is drawn (no ``plots/``, no trial pictures): the
    tables, ``summary.md`` and ``report.html`` (with its SVG timelines) are written as ever. Drawing the plots
    is most of a small run's report time, which a CI gate's runs need not spend.
    """
    drawn = os.environ.get(PLOTS_ENV, "1") != "0"
    pictures = _trial_pictures(trials, timeline, effects) if drawn else {}
    for tid, png in pictures.items():
        run.write_bytes(summary.trial_picture(tid), png)
    summary_path = run.write_text("summary.md", summary.render(meta, trials, effects, set(pictures)))
    pngs = plots.render_all(trials, timeline) if drawn else {}
    if drawn and criteria is not None and not criteria.empty:
        pngs.update({f"criteria_{c}": plots.criteria_plot(criteria, c) for c in plots.CRITERIA_PLOTS})
    plot_paths = {name: run.write_bytes(f"plots/{name}.png", png) for name, png in pngs.items()}
    report_path = run.write_text("report.html", render_html(meta, trials, timeline, effects, pngs, criteria, matrix,
                                                        deviations))
    return ReportFiles(summary_path, report_path, plot_paths)


def _trial_pictures(trials: pd.DataFrame, timeline: pd.DataFrame, effects: pd.DataFrame) -> dict[str, bytes]:
    """The static timeline picture of every invalid trial summary.md lists, by trial id."""
    bad = summary.failing_trials(trials, summary.FAILING_LISTED)
    if bad.empty or timeline.empty:
        return {}
    colours = plots.timeline_colours(timeline)
    out = {}
    for rec in bad[bad["outcome"] == "invalid"].to_dict("records"):
        tid = rec["trial_id"]
        st = timeline[timeline["trial_id"] == tid]
        fx = effects[effects["trial_id"] == tid] if not effects.empty and "trial_id" in effects else pd.DataFrame()
        if not st.empty:
            out[tid] = plots.trial_timeline_png(st, fx, parse_findings(rec.get("findings")), colours,
                                                f"{tid} {rec['arm']} {rec['plan']}: {rec['outcome']}")
    return out


def write_run_report(run: RunDir, meta: dict[str, Any], trials: pd.DataFrame, timeline: pd.DataFrame,
                     effects: pd.DataFrame) -> None:
    """The report a finished run writes (:func:`write_all`); where a plot or the page fails, ``summary.md`` alone
    and the error in ``run.toml`` (the tables are stored: ``cutbench report RUN`` can retry). A full disk is
    raised, not summarised: the run's end names the full directory and how to finish."""
    try:
        write_all(run, meta, trials, timeline, effects)
    except Exception as exc:  # never lose a run to a plot
        if storage.is_full_error(exc):
            raise
        run.write_text("summary.md", summary.render(meta, trials))
        run.update_meta(report_error=f"{type(exc).__name__}: {exc}")


def build(run: RunDir) -> ReportFiles:
    """Regenerate every artefact of ``run`` from its stored ``run.toml`` and tables; return their paths."""
    # Replay commands must name where the run is now (it may have been moved or downloaded).
    meta = {**run.meta(), "run_dir": str(run.path)}
    return write_all(run, meta, run.table("trials"), run.table("timeline"), run.table("effects"), run.table("criteria"),
                     run.table("matrix"), run.table("deviations"))


# -- HTML ----------------------------------------------------------------------


def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def _fmt(value: Any) -> str:
    if value is None or (isinstance(value, float) and value != value):
        return ""
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 1000 else f"{value:,.0f}"
    return str(value)


def _breakable(text: str, after: str) -> str:
    """``text`` escaped, with a line-break opportunity after each character of ``after`` (long names
    such as ``criu_restore_s`` or ``criu/at_least_once/kill`` otherwise force their column wide)."""
    out = _e(text)
    for ch in after:
        out = out.replace(ch, ch + "<wbr>")
    return out


def _html_table(frame: pd.DataFrame, table_id: str, columns: list[str] | None = None, row_class: str | None = None,
                wrap_cells: tuple[str, ...] = (), klass: str = "", links: set[str] | frozenset[str] = frozenset()) -> str:
    """A table of ``frame`` inside its own horizontally scrolling box, so a wide table never widens the page.

    Cells of the ``wrap_cells`` columns may break after ``/`` and ``+``;
    ``klass`` is the ``<table>``'s CSS class; a ``trial_id`` cell whose id is
    in ``links`` links to that trial's timeline (``#trial-<id>``).
    """
    cols = [c for c in (columns or list(frame.columns)) if c in frame.columns]
    head = "".join(f"<th>{_breakable(c, '_')}</th>" for c in cols)
    body = []
    for rec in frame.to_dict("records"):
        cls = f' class="o-{_e(rec.get(row_class))}"' if row_class else ""
        cells = []
        for c in cols:
            v = rec.get(c)
            num = isinstance(v, (int, float)) and not isinstance(v, bool)
            cell_class = "num" if num else ("outcome" if c == "outcome" else "")
            text = _breakable(_fmt(v), "/+") if c in wrap_cells else _e(_fmt(v))
            if c == "trial_id" and v in links:
                text = f'<a href="#trial-{_e(v)}">{text}</a>'
            cells.append(f'<td class="{cell_class}">{text}</td>' if cell_class else f"<td>{text}</td>")
        body.append(f"<tr{cls}>{''.join(cells)}</tr>")
    table_class = f' class="{_e(klass)}"' if klass else ""
    return (f'<div class="table-wrap"><table id="{_e(table_id)}"{table_class}><thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(body)}</tbody></table></div>')


def _kv_table(pairs: list[tuple[str, Any]], table_id: str) -> str:
    rows = "".join(f"<tr><td>{_e(k)}</td><td>{_e(v)}</td></tr>" for k, v in pairs if v not in (None, "", {}))
    return (f'<div class="table-wrap"><table id="{_e(table_id)}" class="kv"><thead><tr><th>field</th><th>value</th></tr></thead>'
            f"<tbody>{rows}</tbody></table></div>")


def _environment_pairs(meta: dict[str, Any]) -> list[tuple[str, Any]]:
    env = meta.get("environment", {})
    criu = env.get("criu") or {}
    gpu = env.get("gpu") or {}
    pairs: list[tuple[str, Any]] = [
        ("os", env.get("os")),
        ("kernel", env.get("kernel")),
        ("python", env.get("python")),
        ("CRIU", f"{criu.get('version')} ({criu.get('source')})" if criu else None),
        ("cutbench", meta.get("cutbench_version")),
    ]
    if isinstance(gpu, dict):
        for key in sorted(gpu):
            if not isinstance(gpu[key], (dict, list)):
                pairs.append((f"gpu.{key}", gpu[key]))
    for name, version in sorted((env.get("packages") or {}).items()):
        pairs.append((name, version))
    return pairs


def _ink(fill: str) -> str:
    """Text colour readable on ``fill``: dark on pale fills, white on strong ones."""
    r, g, b = to_rgb(fill)
    return "#222" if 0.299 * r + 0.587 * g + 0.114 * b > 0.6 else "#fff"


def _legend(items: list[tuple[str, str, str, str]], x0: float, y0: float, width: float) -> tuple[str, float]:
    """SVG legend entries laid out left to right, wrapping at ``width``; returns the markup and the height it takes.

    Each item is ``(attributes of its <g>, swatch, colour, name)``; swatch
    ``fill`` is a filled square, ``outline`` an empty one, ``tick`` a delivery tick.
    """
    parts, x, y = ['<g class="legend">'], x0, y0
    for attrs, kind, colour, label in items:
        step = 16 + _CHAR_PX * len(label) + 14
        if x + step > width and x > x0:
            x, y = x0, y + 18
        if kind == "tick":
            mark = f'<line x1="{x + 6:.1f}" x2="{x + 6:.1f}" y1="{y}" y2="{y + 12}" stroke="{colour}" stroke-width="3"/>'
        elif kind == "outline":
            mark = f'<rect x="{x + 1:.1f}" y="{y + 1}" width="10" height="10" fill="#fff" stroke="{colour}" stroke-width="2.5"/>'
        else:
            mark = f'<rect x="{x:.1f}" y="{y}" width="12" height="12" fill="{colour}" stroke="#999" stroke-width="0.5"/>'
        parts.append(f'<g {attrs}>{mark}<text x="{x + 16:.1f}" y="{y + 10}">{_e(label)}</text></g>')
        x += step
    parts.append("</g>")
    return "".join(parts), y - y0 + 18


def trial_timeline_svg(trial_id: str, stages: pd.DataFrame, effects: pd.DataFrame, colours: dict[str, str] | None = None,
                       findings: list[dict[str, Any]] | None = None) -> str:
    """An inline SVG of one trial: stage bars on a time axis and, below, one lane per incarnation (the delivery's
    sender: 0 the original, 1 the first restored process, …) holding every delivery it sent, placed by its
    arrival sequence number (green: first application of an op, red: applied again, grey: suppressed).

    Every stage has its own colour (``colours``, stage name to colour, keeps
    the report's timelines alike; stages it lacks get the next free ones of
    :func:`cutbench.harness.reports.plots.stage_colours`), a hover title, a
    label when the bar is wide enough, and an entry in the legend under the
    axis that names every stage and delivery kind drawn. A failed or refused
    stage is outlined red. Each cut is a dashed line where the workload was
    parked for it; an op applied twice has its applications joined by a red
    arc; an op of a ``missing`` finding (``findings``, the verdict's) is a red
    ring in the last lane, after the last delivery of an op before it.
    """
    width, left, right = 1060, 130, 20
    stages = stages.sort_values("t_start")
    colours = plots.stage_colours([*(colours or {}), *stages["stage"]])
    end = max(float(stages["t_end"].max()) if not stages.empty else 0.0, 1e-3)
    epochs = plots.lanes(effects)
    bar_h, lane_h = 18, 26
    frame = _Frame(left=left, scale=(width - left - right) / end, y_stage=24, bar_h=bar_h,
                   y_axis=62 + len(epochs) * lane_h - lane_h + bar_h,
                   lane_y={e: 62 + i * lane_h for i, e in enumerate(epochs)})
    lane_y, y_axis = frame.lane_y, frame.y_axis
    marks = [f'<text x="4" y="{frame.y_stage + 13}">stages</text>']
    for e, y in lane_y.items():
        name = "original" if e == 0 else f"restored #{e}"
        marks.append(f'<text class="lane" data-epoch="{e}" x="4" y="{y + 13}">{name} (epoch {e})</text>'
                     f'<line x1="{left}" x2="{width - right}" y1="{y + bar_h / 2}" y2="{y + bar_h / 2}" stroke="#eee"/>')
    failed = _stage_marks(stages, colours, frame, marks)
    kinds, placed = _delivery_marks(stages, effects, frame, marks)
    scale = frame.scale
    missing = sorted({int(f["op"]) for f in findings or () if f.get("kind") == "missing" and isinstance(f.get("op"), int)})
    for op in missing:
        x = max((px for px, pop in placed if pop < op), default=left) + 6
        cy = lane_y[epochs[-1]] + bar_h / 2
        marks.append(f'<circle class="missing" data-op="{op}" cx="{x:.1f}" cy="{cy:.1f}" r="6" fill="none" '
                     f'stroke="{_EFFECT_COLOURS["again"]}" stroke-width="2"><title>op {op}: committed by the workload, '
                     f'never applied</title></circle>')
    for k in range(6):
        t = end * k / 5
        x = left + t * scale
        marks.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{y_axis + 6}" y2="{y_axis + 10}" stroke="#888"/>'
                     f'<text x="{x:.1f}" y="{y_axis + 22}" text-anchor="middle" fill="#555">{t:.2f}s</text>')

    # Stages in the order this trial met them, then the failure outline and the delivery kinds drawn.
    items = [(f'class="legend-item stage" data-stage="{_e(name)}"', "fill", colours[name], name) for name in dict.fromkeys(stages["stage"])]
    if failed:
        items.append(('class="legend-item failed"', "outline", _FAILED_COLOUR, "failed or refused"))
    items += [(f'class="legend-item effect" data-kind="{kind}"', "tick", _EFFECT_COLOURS[kind], _EFFECT_NAMES[kind])
              for kind in _EFFECT_COLOURS if kind in kinds]
    if missing:
        items.append(('class="legend-item missing"', "outline", _EFFECT_COLOURS["again"], "missing (never applied)"))
    y_legend = y_axis + 36
    legend, legend_h = _legend(items, left, y_legend, width - right)
    height = int(y_legend + legend_h + 4)
    head = (f'<svg class="timeline" id="tl-{_e(trial_id)}" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" role="img" aria-label="timeline of trial {_e(trial_id)}">')
    return "".join([head, *marks, f'<text x="4" y="{y_legend + 10}">legend</text>', legend, "</svg>"])


@dataclass(frozen=True)
class _Frame:
    """Where a trial's timeline draws: the time axis (``left`` + seconds × ``scale``), the stage row, the lane of
    each incarnation and the axis line."""

    left: float
    scale: float
    y_stage: float
    bar_h: float
    y_axis: float
    lane_y: dict[int, float]

    def lane_of(self, lane: int | None) -> float:
        """The y of incarnation ``lane``'s row: the last row for no incarnation or one without a row."""
        last = self.lane_y[list(self.lane_y)[-1]]
        return last if lane is None else self.lane_y.get(lane, last)


def _stage_marks(stages: pd.DataFrame, colours: dict[str, str], f: _Frame, marks: list[str]) -> bool:
    """Draw each stage as a bar (its label where it fits) and each cut as a dashed line into ``marks``; return
    whether a stage failed or was refused."""
    failed = False
    for r in stages.itertuples():
        x = f.left + float(r.t_start) * f.scale
        w = max(1.5, float(r.duration_s) * f.scale)
        colour = colours[r.stage]
        bad = r.result in ("failed", "refused")
        failed = failed or bad
        outline = f'stroke="{_FAILED_COLOUR}" stroke-width="2.5"' if bad else 'stroke="#fff"'
        cpu = getattr(r, "cpu_s", None)  # absent from runs stored before CPU accounting, None on an unsampled stage
        cpu_words = f", {float(cpu) * 1000:.1f} ms CPU" if cpu is not None and cpu == cpu else ""
        tip = (f"{r.stage} (cut {r.cut_index}) {float(r.duration_s) * 1000:.1f} ms{cpu_words} {r.result} {r.detail or ''} "
               f"{r.error or ''}").strip()
        marks.append(f'<rect class="stage{" failed" if bad else ""}" data-stage="{_e(r.stage)}" x="{x:.1f}" y="{f.y_stage}" '
                     f'width="{w:.1f}" height="{f.bar_h}" fill="{colour}" {outline}><title>{_e(tip)}</title></rect>')
        if w > _CHAR_PX * len(str(r.stage)) + 6:
            # The label lets the pointer through, so hovering it still shows the bar's title.
            marks.append(f'<text x="{x + 3:.1f}" y="{f.y_stage + 13}" fill="{_ink(colour)}" pointer-events="none">{_e(r.stage)}</text>')
        if r.stage == "reach_cut":  # the moment the workload was parked for cut k: where the cut fell
            xc, where = f.left + float(r.t_end) * f.scale, f"cut {r.cut_index}: {r.detail or ''}"
            marks.append(f'<line class="cut" data-cut="{r.cut_index}" x1="{xc:.1f}" x2="{xc:.1f}" y1="{f.y_stage - 6}" '
                         f'y2="{f.y_axis}" stroke="#555" stroke-dasharray="4 3"><title>{_e(where)}</title></line>'
                         f'<text x="{xc + 2:.1f}" y="{f.y_stage - 8}" fill="#555">cut {r.cut_index}</text>')
    return failed


def _delivery_marks(stages: pd.DataFrame, effects: pd.DataFrame, f: _Frame,
                    marks: list[str]) -> tuple[list[str], list[tuple[float, int]]]:
    """Draw each delivery as a tick in its sender's lane (an op applied again joined to its first application)
    into ``marks``; return the kinds of delivery drawn and the (x, op) of each."""
    first_at: dict[int, tuple[float, float]] = {}
    kinds: list[str] = []
    placed: list[tuple[float, int]] = []
    if effects.empty:
        return kinds, placed
    effects = effects.sort_values("arrival_seq")
    for fx, t in zip(effects.itertuples(), plots.effect_times(stages, effects)):
        if t is None:
            continue
        op, x = int(fx.op_id), f.left + t * f.scale
        y = f.lane_of(sender_of(fx))
        if fx.decision in ("applied", "committed"):
            kind = "again" if op in first_at else "first"
            if kind == "again":  # the op's two applications, joined over the lanes between them
                x0, y0 = first_at[op]
                top = min(y0, y) - 4
                marks.append(f'<path class="dup-join" data-op="{op}" d="M{x0:.1f},{y0:.1f} C{x0:.1f},{top:.1f} {x:.1f},{top:.1f} '
                             f'{x:.1f},{y:.1f}" fill="none" stroke="{_EFFECT_COLOURS["again"]}" stroke-width="1.2" '
                             f'stroke-dasharray="3 2"><title>op {op} applied again</title></path>')
            else:
                first_at[op] = (x, y)
        else:
            kind = "suppressed" if fx.decision in ("suppressed", "aborted", "rejected") else "other"
        kinds += [kind] if kind not in kinds else []
        placed.append((x, op))
        tip = (f"op {op} attempt {getattr(fx, 'attempt', '')} epoch {getattr(fx, 'epoch', '')} {getattr(fx, 'kind', '')}: "
               f"{fx.decision} (arrival {fx.arrival_seq})")
        marks.append(f'<line class="effect {kind}" data-op="{op}" x1="{x:.1f}" x2="{x:.1f}" y1="{y}" y2="{y + f.bar_h}" '
                     f'stroke="{_EFFECT_COLOURS[kind]}" stroke-width="{3 if kind == "again" else 2}"><title>{_e(tip)}</title></line>')
    return kinds, placed


def _pick_timelines(trials: pd.DataFrame) -> list[str]:
    """The trials whose timelines the page draws: failing ones first, then the first of each arm, then the
    rest in trial order, up to :data:`MAX_TIMELINES` (a run that size or smaller has every trial drawn)."""
    picked = list(summary.failing_trials(trials, MAX_TIMELINES)["trial_id"])
    ordered = trials.sort_values("trial_id")
    firsts = [g["trial_id"].iloc[0] for _arm, g in ordered.groupby("arm", sort=True)]
    for tid in [*firsts, *ordered["trial_id"]]:
        if len(picked) >= MAX_TIMELINES:
            break
        if tid not in picked:
            picked.append(tid)
    return picked


def _banner(meta: dict[str, Any], trials: pd.DataFrame) -> str:
    v = summary.run_verdict(trials, meta)
    partial = '<span class="partial">partial run: interrupted</span>' if meta.get("status") == "partial" else ""
    counts = ", ".join(f"{k} {n}" for k, n in v.counts.items())
    detail = (f"invalid recovery rate {summary.pct(v.rate)} (95% CI {summary.pct(v.low)}–{summary.pct(v.high)}) "
              f"over {v.with_verdict} trials with a verdict; {counts}")
    return f'<div class="banner {v.label}" id="verdict" data-verdict="{v.label}">{_e(v.text)}{partial}<small>{_e(detail)}</small></div>'


def _findings_list(trials: pd.DataFrame, run_dir: str, links: set[str]) -> str:
    bad = summary.failing_trials(trials)
    if bad.empty:
        return '<p class="muted">No invalid or unknown trial.</p>'
    variants = summary.group_columns(trials)[:-1]
    rows = []
    for rec in bad.to_dict("records"):
        rows.append({"trial_id": rec["trial_id"], **{k: rec[k] for k in variants}, "arm": rec["arm"], "plan": rec["plan"],
                     "outcome": rec["outcome"], "findings": summary.findings_text(rec, 6),
                     "last words": rec.get("last_words") or "", "replay": summary.replay_command(run_dir, rec["trial_id"])})
    table = pd.DataFrame(rows)
    if not table["last words"].astype(bool).any():
        table = table.drop(columns="last words")
    return _html_table(table, "failing-trials", row_class="outcome", links=links)


def _certificates(trials: pd.DataFrame) -> list[str]:
    """The certificates section: the claim against the verdict (none when no cut was certified)."""
    m = certificate_matrix(trials)
    if not m["certified"]:
        return []
    items = "".join(f"<li>{_e(s).replace('`', '')}</li>" for s in summary.certificate_sentences(m))
    return ['<h2 id="certificates">Recovery-cut certificates</h2>',
            _html_table(pd.DataFrame(summary.certificate_grid(m)), "certificate-matrix"),
            f"<ul>{items}</ul><p>Each trial's certificates: <code>trials/&lt;id&gt;.json</code> and "
            "<code>certificates.parquet</code>.</p>"]


def _criteria_section(table: pd.DataFrame, pngs: dict[str, bytes]) -> list[str]:
    """The six criteria per backend: the table (value with interval, how measured, the command) and a plot per criterion."""
    from cutbench.harness.reports.criteria import display

    shown = display(table).assign(command=table["command"])
    out = ['<h2 id="criteria">The six criteria</h2>',
           '<p class="muted">Consistency, transparency, coverage, speed, correctness and overhead per backend, from the '
           "runs named to <code>cutbench criteria</code>; every value says how it was measured.</p>",
           _html_table(shown, "criteria-table", wrap_cells=("method", "command"))]
    for name in [n for n in pngs if n.startswith("criteria_")]:
        data = base64.b64encode(pngs[name]).decode("ascii")
        out.append(f'<figure id="plot-{_e(name)}"><img alt="{_e(name)}" src="data:image/png;base64,{data}">'
                   f"<figcaption>{_e(name.removeprefix('criteria_'))} per backend, with 95% intervals.</figcaption></figure>")
    return out


def render_html(meta: dict[str, Any], trials: pd.DataFrame, timeline: pd.DataFrame, effects: pd.DataFrame, pngs: dict[str, bytes],
                criteria: pd.DataFrame | None = None, matrix: pd.DataFrame | None = None,
                deviations: pd.DataFrame | None = None) -> str:
    """The complete, self-contained ``report.html`` text for a run (with the criteria section when ``criteria`` has
    rows, the support-matrix section when ``matrix`` or ``deviations`` has)."""
    scen = meta.get("scenario", {})
    title = f"cutbench {scen.get('name', '')} {meta.get('run_id', '')}"
    out = [f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{_e(title)}</title>'
           f'<meta name="viewport" content="width=device-width, initial-scale=1"><style>{_CSS}</style></head><body>']
    out.append(_banner(meta, trials))
    out.append("<main>")
    out.append(f"<h1>{_e(title)}</h1>")
    if scen.get("description"):
        out.append(f'<p class="muted">{_e(scen["description"])}</p>')
    out += _run_section(meta, trials)
    if (matrix is not None and not matrix.empty) or (deviations is not None and not deviations.empty):
        from cutbench.harness.matrix.reports import html_section

        out.append(html_section(matrix if matrix is not None else pd.DataFrame(), deviations))
    for skipped in meta.get("skipped_arms", [])[:MAX_SKIPPED_LINES]:
        out.append(f'<p class="muted">skipped arm {_e(skipped.get("arm"))}: {_e(skipped.get("reason"))}</p>')
    if len(meta.get("skipped_arms", [])) > MAX_SKIPPED_LINES:
        out.append(f'<p class="muted">… and {len(meta["skipped_arms"]) - MAX_SKIPPED_LINES} more skipped arms (run.toml lists them all)</p>')
    if trials.empty:
        out.append("<p>No trial finished, so there is nothing to plot.</p>")
    else:
        out += _rates_and_findings(trials, str(meta.get("run_dir", "")))
    if criteria is not None and not criteria.empty:
        out += _criteria_section(criteria, pngs)
    out.append('<h2 id="plots">Plots</h2>')
    for name, (caption, _fn) in plots.PLOTS.items():
        png = pngs.get(name)
        if png is None:
            continue
        data = base64.b64encode(png).decode("ascii")
        out.append(f'<figure id="plot-{_e(name)}"><img alt="{_e(name)}" src="data:image/png;base64,{data}">'
                   f"<figcaption>{_e(caption)}</figcaption></figure>")
    if not trials.empty:
        ids = _pick_timelines(trials)
        out += _timelines(meta, trials, timeline, effects, ids)
        out += _all_trials(trials, ids)
    out.append('<h2 id="environment">Environment</h2>' + _kv_table(_environment_pairs(meta), "environment-table"))
    out.append(f"</main><script>{_CHECK_JS}</script></body></html>")
    return "\n".join(out)


def _run_section(meta: dict[str, Any], trials: pd.DataFrame) -> list[str]:
    """The report's "Run" section: where the run is, its status and size, its workloads, store and plan source."""
    scen = meta.get("scenario", {})
    started = meta.get("started")
    when = _dt.datetime.fromtimestamp(started, _dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC") if isinstance(started, (int, float)) else None
    run_pairs = [
        ("run directory", str(meta.get("run_dir", ""))),
        ("status", meta.get("status")),
        ("started", when),
        ("duration", f"{meta.get('duration_s', 0):.1f} s"),
        ("trials", f"{len(trials)} of {meta.get('n_trials_planned', '?')} planned"
                   + (", stopped at the first invalid one" if meta.get("first_invalid") else "")),
        ("scenario file", scen.get("source_path")),
        *[(f"workload{' of ' + sub['variant'] if sub.get('variant') else ''}",
           f"{sub.get('workload')} ({sub.get('array')}) {json.dumps(sub.get('params', {}), sort_keys=True)}")
          for sub in (scen.get("variants") or [scen])],
        ("receiver store", scen.get("store")),
        ("plan source", f"{scen.get('plan_source')} ops {scen.get('plan_ops')} phases {', '.join(scen.get('plan_phases', []))}"),
    ]
    for axis, values in (meta.get("sweep") or {}).get("axes", {}).items():
        run_pairs.append((f"sweep axis {axis}", ", ".join(map(str, values))))
    return ['<h2 id="run">Run</h2>' + _kv_table(run_pairs, "run-table")]


def _rates_and_findings(trials: pd.DataFrame, run_dir: str) -> list[str]:
    """The invalid recovery rates (by arm, then by cut phase, fault and receiver mode), the findings' totals and
    list, and the certificates' section."""
    out = []
    by = summary.group_columns(trials)
    out.append(f'<h2 id="by-arm">Invalid recovery rate by {" and ".join(by)}</h2>')
    out.append(_html_table(summary.compact_rates(summary.rates(trials, by)), "rates-by-arm"))
    with_cut = trials[trials["cut_phase"].notna()]
    if not with_cut.empty:
        # Receiver modes are never pooled: 100% at_least_once and 0% idempotent is not "50%".
        out.append(f'<h2 id="by-phase">By {"variant, " if by[:-1] else ""}cut phase, fault and receiver mode</h2>')
        # Nor are variants: a correct twin at 0% and its buggy variant at 100% is not "50%".
        keys = [*by[:-1], "cut_phase", "fault", "receiver_mode"]
        out.append(_html_table(summary.compact_rates(summary.rates(with_cut, keys)), "rates-by-phase"))
    totals = summary.finding_totals(trials)
    out.append('<h2 id="findings">Findings</h2>')
    out.append(_html_table(pd.DataFrame([{"finding": k, "count": n} for k, n in totals.items()]), "finding-totals"))
    out.append(_findings_list(trials, run_dir, set(_pick_timelines(trials))))
    out += _certificates(trials)
    return out


def _timelines(meta: dict[str, Any], trials: pd.DataFrame, timeline: pd.DataFrame, effects: pd.DataFrame,
               ids: list[str]) -> list[str]:
    """The per-trial timelines of the trials ``ids``, each with its explanation in plain words."""
    out = ['<h2 id="timelines">Per-trial timelines</h2>',
           '<p class="muted">Stages as bars, each stage in its own colour (the legend under each timeline names them; '
           "a red outline: the stage failed or refused), and receiver deliveries (green: first application of an op, "
           "red: the same op applied again, grey: suppressed), placed by the receiver's arrival order. Hover a bar or "
           "tick for details. Failing trials first, then the first trial of each arm, then the others "
           f"(up to {MAX_TIMELINES}).</p>"]
    colours = plots.timeline_colours(timeline)  # one colour per stage, as in the stage-time plot
    by_id = trials.set_index("trial_id")
    for n, tid in enumerate(ids):
        row = by_id.loc[tid]
        st = timeline[timeline["trial_id"] == tid] if not timeline.empty else timeline
        fx = effects[effects["trial_id"] == tid] if not effects.empty and "trial_id" in effects else pd.DataFrame()
        if st.empty:
            continue
        opened = " open" if n < 3 else ""
        words = explain({**row.to_dict(), "trial_id": tid}, fx, resume=resume_flag(meta, row.get("variant", "")))
        words = f'<p class="explain">{_e(words)}</p>' if words else ""
        out.append(f'<details id="trial-{_e(tid)}"{opened}><summary><b>{_e(tid)}</b> {_e(row["arm"])} — {_e(row["plan"])} → '
                   f"<b>{_e(row['outcome'])}</b> {_e(row.get('error') or '')}</summary>"
                   f"{words}{trial_timeline_svg(tid, st, fx, colours, parse_findings(row.get('findings')))}</details>")
    return out


def _all_trials(trials: pd.DataFrame, linked: list[str]) -> list[str]:
    """The table of every trial (the first ``MAX_TRIAL_ROWS``), the ``linked`` ones pointing at their timelines."""
    out = ['<h2 id="trials">All trials</h2>']
    cols = ["trial_id", "arm", "plan", "status", "outcome", "n_findings", "restores", "n_effects", "duration_s",
            "criu_dump_s", "criu_restore_s", "image_bytes", "error"]
    if "variant" in trials and summary.group_columns(trials)[0] == "variant":
        cols.insert(1, "variant")
    if "cert_eligible" in trials and trials["cert_eligible"].notna().any():
        cols[cols.index("error"):cols.index("error")] = ["cert_eligible", "cert_reason"]
    shown = trials.head(MAX_TRIAL_ROWS)
    if len(trials) > MAX_TRIAL_ROWS:
        out.append(f'<p class="muted">First {MAX_TRIAL_ROWS} of {len(trials)} trials; trials.parquet has them all.</p>')
    # The trial ID stays in view while the rest of a wide table scrolls.
    out.append(_html_table(shown, "all-trials", cols, row_class="outcome", wrap_cells=("arm",), klass="sticky-first",
                           links=set(linked)))
    return out
