"""The support matrix for people: ``matrix.md``, the comparison of two matrices, and the report's section.

Pure renderers: the matrix table (:mod:`cutbench.harness.matrix.checker`) in, text out. One row per
probe row, one column per tool and fault; a cell *restored silently wrong* is written in capitals and
bold, and counted at the top.
"""

from __future__ import annotations

import html
import json
from typing import Any

import pandas as pd

from cutbench.harness.matrix.checker import CELLS, ENVIRONMENT_COLUMNS

# How each cell reads in a table (the bad ones louder).
LABEL: dict[str, str] = {"identical": "identical", "refused": "refused", "failed": "FAILED", "hung": "HUNG",
                         "wrong": "**WRONG**", "unknown": "unknown", "not_measured": "–"}
# Background colours in the HTML section.
COLOUR: dict[str, str] = {"identical": "#d9f2dd", "refused": "#eeeeee", "failed": "#f9d6d2", "hung": "#f6c28b",
                          "wrong": "#b3261e", "unknown": "#fff1b8", "not_measured": "#ffffff"}


def _columns(table: pd.DataFrame) -> list[tuple[str, str]]:
    return list(dict.fromkeys(zip(table["tool"], table["fault"], strict=True)))


def counts(table: pd.DataFrame) -> dict[str, int]:
    """How many cells of each kind (every kind of :data:`CELLS`, zeros included)."""
    found = table["cell"].value_counts().to_dict() if not table.empty else {}
    return {c: int(found.get(c, 0)) for c in CELLS}


def _environment_line(table: pd.DataFrame) -> str:
    parts = []
    for col in ENVIRONMENT_COLUMNS:
        values = sorted({str(v) for v in table[col] if str(v)}) if col in table else []
        if values:
            parts.append(f"{col} {', '.join(values)}")
    return "; ".join(parts)


def replay_command(run_dir: str, trial_id: str) -> str:
    """The command that reruns the trial behind a cell."""
    return f"cutbench replay {run_dir}/trials/{trial_id}.json" if trial_id else ""


def deviations_markdown(deviations: pd.DataFrame | None) -> list[str]:
    """The lines of ``matrix.md``'s section of lifecycle deviations (``cutbench hunt``), one row per deviation
    per tool; none when there are none."""
    if deviations is None or deviations.empty:
        return []
    out = ["", "## Lifecycle deviations (`cutbench hunt`)", "",
           "Sequences of lifecycle steps after which a tool did not do what its documentation says, each shrunk "
           "and shown by a standalone reproducer (no cutbench in it); a cell above measures one lifecycle.", "",
           "| tool | driver | sequence | documented | what happened | public report | reproducer (shown alone) |",
           "|---|---|---|---|---|---|---|"]
    cell = lambda v: str(v).replace("|", "\\|")  # noqa: E731
    for r in deviations.to_dict("records"):
        out.append(f"| `{r['tool']}` | {r['driver']} | {cell(r['sequence'])} | {cell(r['promised'])} | "
                   f"{cell(r['observed'])} | {cell(r['public_report'])} | `{r['reproducer']}` ({r['shown']}) |")
    return out


def markdown(table: pd.DataFrame, unavailable: dict[str, str] | None = None,
             deviations: pd.DataFrame | None = None) -> str:
    """Return the text of ``matrix.md``: the environment, the cell counts, the grid, then every cell that is not identical with
    its detail and replay command, then the tools' lifecycle deviations (``deviations``: the stored table of
    :func:`cutbench.harness.hunt.store.deviation_rows`). ``unavailable``: tools left out because they
    cannot run here, and why."""
    if table.empty:
        return "\n".join(["# CUDA support matrix", "", "No cells.", *deviations_markdown(deviations)]) + "\n"
    n = counts(table)
    out = ["# CUDA support matrix", "", f"- measured on: {_environment_line(table)}",
           "- cells: " + ", ".join(f"{k} {v}" for k, v in n.items() if v),
           f"- **restored silently wrong: {n['wrong']}** (the tool reported success; state, an effect or a pointer "
           "differs from the uninterrupted run)", "",
           "Cells: identical = continued identically (digests, pointers and output equal to an uninterrupted run); "
           "refused = the tool declined and the process ran on by itself; FAILED = the tool failed (or declined but "
           "left the process for the harness to bring back); HUNG = no progress; **WRONG** = restored silently wrong; "
           "– = not measured here (the reason is below).", ""]
    for tool, why in (unavailable or {}).items():
        out.insert(-1, f"- not a column: `{tool}` cannot run here ({why})")
    cols = _columns(table)
    out.append("| row | feature | " + " | ".join(f"{t} · {f}" for t, f in cols) + " |")
    out.append("|---|---|" + "|".join(":-:" for _ in cols) + "|")
    for row, sub in table.groupby("row", sort=False):
        by = {(r["tool"], r["fault"]): r for r in sub.to_dict("records")}
        feature = sub["feature"].iloc[0]
        out.append(f"| `{row}` | {feature} | " + " | ".join(LABEL[by[c]["cell"]] if c in by else "" for c in cols) + " |")
    out += ["", "## Cells that are not identical", ""]
    for rec in table.to_dict("records"):
        if rec["cell"] in ("identical", "not_measured"):
            continue
        line = f"- `{rec['row']}` · {rec['tool']} · {rec['fault']}: **{rec['cell']}** — {rec['detail'] or '(no detail)'}"
        if rec.get("measures"):
            line += f" (measures: {rec['measures']})"
        cmd = replay_command(rec["run_dir"], rec["trial_id"])
        out.append(line + (f"  \n  `{cmd}`" if cmd else ""))
    skipped: dict[str, list[str]] = {}
    for rec in table.to_dict("records"):
        if rec["cell"] == "not_measured":
            skipped.setdefault(rec["detail"], []).append(f"{rec['row']} · {rec['tool']} · {rec['fault']}")
    if skipped:
        out += ["", "## Not measured here", ""]
        for reason, where in skipped.items():
            shown = ", ".join(where[:4]) + (f" and {len(where) - 4} more" if len(where) > 4 else "")
            out.append(f"- {reason} ({len(where)} cells: {shown})")
    measured = [r for r in table.to_dict("records") if r.get("measures")]
    if measured:
        out += ["", "## Measures", "", "| row | tool | fault | measures |", "|---|---|---|---|"]
        out += [f"| `{r['row']}` | {r['tool']} | {r['fault']} | {r['measures']} |" for r in measured]
    out += deviations_markdown(deviations)
    return "\n".join(out) + "\n"


def comparison(changed: pd.DataFrame, env: dict[str, tuple[str, str]], a: str, b: str) -> str:
    """What changed between two matrices, as Markdown: the environment, then every cell that changed."""
    out = [f"# Support matrix: {a} → {b}", ""]
    if env:
        out += ["| | A | B |", "|---|---|---|"] + [f"| {k} | {va} | {vb} |" for k, (va, vb) in env.items()] + [""]
    if changed.empty:
        out.append("No cell changed.")
        return "\n".join(out) + "\n"
    out += [f"{len(changed)} cells changed:", "", "| row | feature | tool | fault | A | B | detail in B |",
            "|---|---|---|---|---|---|---|"]
    for r in changed.to_dict("records"):
        out.append(f"| `{r['row']}` | {r['feature']} | {r['tool']} | {r['fault']} | {r['cell_a']} | {r['cell_b']} | "
                   f"{str(r.get('detail_b') or '')[:160]} |")
    return "\n".join(out) + "\n"


def _anchor(rec: dict[str, Any]) -> str:
    """The HTML id of a cell's entry (row, tool and fault: unique in a matrix, also one merged from several runs)."""
    return "cell-" + "-".join("".join(ch if ch.isalnum() else "_" for ch in str(rec[k])) for k in ("row", "tool", "fault"))


def html_section(table: pd.DataFrame, deviations: pd.DataFrame | None = None) -> str:
    """The report's support-matrix section: the grid (each measured cell links to its entry below, which
    names the trial and its replay command), then the entries of the cells that are not identical, then the
    tools' lifecycle deviations (``deviations``, as :func:`markdown` takes it)."""
    e = _e
    if table.empty:
        return _deviations_html(deviations)
    n = counts(table)
    cols = _columns(table)
    out = ['<h2 id="support-matrix">CUDA support matrix</h2>',
           f'<p>Measured on {e(_environment_line(table))}. Cells: '
           + ", ".join(f"{e(k)} {v}" for k, v in n.items() if v)
           + f'. <b>Restored silently wrong: {n["wrong"]}</b>.</p>',
           '<div class="table-wrap"><table id="support-matrix-table"><thead><tr><th>row</th><th>feature</th>'
           + "".join(f"<th>{e(t)}<br>{e(f)}</th>" for t, f in cols) + "</tr></thead><tbody>"]
    for row, sub in table.groupby("row", sort=False):
        by = {(r["tool"], r["fault"]): r for r in sub.to_dict("records")}
        cells = []
        for c in cols:
            rec = by.get(c)
            if rec is None:
                cells.append("<td></td>")
                continue
            word = rec["cell"]
            ink = "#fff" if word == "wrong" else "#1d1d1f"
            text = LABEL[word].strip("*")
            title = rec["detail"] or replay_command(rec["run_dir"], rec["trial_id"]) or word
            listed = word != "identical" and rec["trial_id"]
            link = f'<a href="#{_anchor(rec)}" style="color:{ink}">{e(text)}</a>' if listed else e(text)
            cells.append(f'<td class="cell-{e(word)}" style="background:{COLOUR[word]};color:{ink};text-align:center" '
                         f'title="{e(title)}">{link}</td>')
        out.append(f"<tr><td><code>{e(row)}</code></td><td>{e(sub['feature'].iloc[0])}</td>{''.join(cells)}</tr>")
    out.append("</tbody></table></div>")
    entries = [r for r in table.to_dict("records") if r["cell"] != "identical" and r["trial_id"]]
    if entries:
        out.append('<details open><summary>Cells that are not identical: the tool\'s words and the replay command</summary><ul>')
        for r in entries:
            measures = f" <span class=\"muted\">measures {e(r['measures'])}</span>" if r.get("measures") else ""
            out.append(f'<li id="{_anchor(r)}"><code>{e(r["row"])}</code> · {e(r["tool"])} · {e(r["fault"])}: '
                       f'<b>{e(r["cell"])}</b> — {e(r["detail"])}{measures}<br><code>'
                       f'{e(replay_command(r["run_dir"], r["trial_id"]))}</code></li>')
        out.append("</ul></details>")
    skipped = [r for r in table.to_dict("records") if r["cell"] == "not_measured"]
    if skipped:
        reasons = sorted({r["detail"] for r in skipped})
        out.append('<details><summary>Not measured here, and why</summary><ul>'
                   + "".join(f"<li>{e(reason)}</li>" for reason in reasons) + "</ul></details>")
    out.append(_deviations_html(deviations))
    return "\n".join(out)


def _e(value: Any) -> str:
    """``value`` as HTML text (None as nothing), quotes escaped for attributes."""
    return html.escape("" if value is None else str(value), quote=True)


def _deviations_html(deviations: pd.DataFrame | None) -> str:
    """The report's table of lifecycle deviations, one row per deviation per tool ("" when none)."""
    if deviations is None or deviations.empty:
        return ""
    e = _e
    out = ['<h3 id="lifecycle-deviations">Lifecycle deviations (cutbench hunt)</h3>',
           "<p>Sequences of lifecycle steps after which a tool did not do what its documentation says, each "
           "shrunk and shown by a standalone reproducer (no cutbench in it).</p>",
           '<div class="table-wrap"><table id="lifecycle-deviations-table"><thead><tr><th>tool</th><th>driver</th>'
           "<th>sequence</th><th>documented</th><th>what happened</th><th>public report</th>"
           "<th>reproducer (shown alone)</th></tr></thead><tbody>"]
    for r in deviations.to_dict("records"):
        out.append(f"<tr><td><code>{e(r['tool'])}</code></td><td>{e(r['driver'])}</td><td>{e(r['sequence'])}</td>"
                   f"<td title=\"{e(r['source'])}\">{e(r['promised'])}</td><td>{e(r['observed'])}</td>"
                   f"<td>{e(r['public_report'])}</td><td><code>{e(r['reproducer'])}</code> ({e(r['shown'])})</td></tr>")
    out.append("</tbody></table></div>")
    return "\n".join(out)


def as_records(table: pd.DataFrame) -> list[dict[str, Any]]:
    """The matrix as JSON-ready records (``cutbench matrix --json``)."""
    return json.loads(table.to_json(orient="records"))
