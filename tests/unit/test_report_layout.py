"""The report's figures as data: per-trial timeline colours, labels and legend; the restore-time plot's axes.

No CRIU: stage and trial rows are built in the shapes the runner stores
(``timeline.parquet``, ``trials.parquet``) and handed to the pure renderers.
The page's layout in a real browser is checked in ``tests/criu/test_report.py``.
"""

from __future__ import annotations

import io
import xml.etree.ElementTree as ET

import matplotlib.pyplot as plt
import pandas as pd
import pytest
from matplotlib.collections import PathCollection

from cutbench.harness.reports import html as report
from cutbench.harness.reports import plots

SVG = "{http://www.w3.org/2000/svg}"


def stage_rows(*stages: tuple[str, float, str], trial_id: str = "t0001") -> pd.DataFrame:
    """Timeline rows of one trial from ``(stage, duration_s, result)``, back to back from t = 0."""
    rows, t = [], 0.0
    for n, (stage, duration, result) in enumerate(stages):
        rows.append({"trial_id": trial_id, "cut_index": 0, "stage": stage, "t_start": t, "t_end": t + duration,
                     "duration_s": duration, "result": result, "error": "", "hwm_before": n, "hwm_after": n + 1,
                     "bytes": float("nan"), "detail": ""})
        t += duration + 0.001
    return pd.DataFrame(rows)


# A leave_running trial as CRIU runs it: criu_restore and the fault are narrow next to the long harness stages.
LEAVE_RUNNING = stage_rows(("spawn", 0.0004, "ok"), ("reach_cut", 2.5, "ok"), ("criu_dump", 0.07, "ok"),
                           ("run_until_crash", 0.1, "ok"), ("fault_leave_running", 0.0004, "ok"),
                           ("criu_restore", 0.05, "ok"), ("run_to_end", 3.0, "ok"))


def parse(svg: str) -> ET.Element:
    return ET.fromstring(svg)


def bars(root: ET.Element) -> list[ET.Element]:
    return [r for r in root.iter(f"{SVG}rect") if "stage" in r.get("class", "").split()]


def bar_stage(rect: ET.Element) -> str:
    """The stage a bar draws, as its hover title names it (the first word)."""
    return rect.find(f"{SVG}title").text.split()[0]


def legend_stages(root: ET.Element) -> dict[str, str]:
    """Legend entry name -> swatch colour, for the stage entries."""
    out = {}
    for g in root.iter(f"{SVG}g"):
        if g.get("class") == "legend-item stage":
            out[g.find(f"{SVG}text").text] = g.find(f"{SVG}rect").get("fill")
    return out


def test_every_stage_has_its_own_colour_and_a_legend_entry():
    root = parse(report.trial_timeline_svg("t0001", LEAVE_RUNNING, pd.DataFrame()))
    fill = {}
    for rect in bars(root):
        fill.setdefault(bar_stage(rect), set()).add(rect.get("fill"))
    stages = list(LEAVE_RUNNING["stage"])
    assert set(fill) == set(stages) and all(len(f) == 1 for f in fill.values()), fill
    colours = {s: f.pop() for s, f in fill.items()}
    assert len(set(colours.values())) == len(stages), colours  # criu_dump and criu_restore no longer share one
    assert legend_stages(root) == colours


def test_narrow_bars_are_named_by_title_and_legend():
    root = parse(report.trial_timeline_svg("t0001", LEAVE_RUNNING, pd.DataFrame()))
    labels = {t.text for t in root.iter(f"{SVG}text")}
    legend = legend_stages(root)
    assert [bar_stage(r) for r in bars(root)] == list(LEAVE_RUNNING["stage"])
    for rect in bars(root):
        stage = bar_stage(rect)
        assert stage in legend and legend[stage] == rect.get("fill"), stage
    # The long harness stages are wide enough to carry their name on the bar too.
    assert {"reach_cut", "run_to_end"} <= labels


def test_wide_bars_carry_their_label_and_it_fits():
    wide = stage_rows(("reach_cut", 0.2, "ok"), ("criu_dump", 0.2, "ok"), ("run_until_crash", 0.2, "ok"),
                      ("criu_restore", 0.2, "ok"), ("run_to_end", 0.2, "ok"))
    root = parse(report.trial_timeline_svg("t0001", wide, pd.DataFrame()))
    legend_texts = {id(t) for g in root.iter(f"{SVG}g") if g.get("class") == "legend" for t in g.iter(f"{SVG}text")}
    bar_y = float(bars(root)[0].get("y"))
    on_bars = [t for t in root.iter(f"{SVG}text") if id(t) not in legend_texts and bar_y < float(t.get("y")) < bar_y + 18
               and float(t.get("x")) > float(bars(root)[0].get("x"))]
    assert [t.text for t in on_bars] == list(wide["stage"])
    for text, rect in zip(on_bars, bars(root)):
        room = float(rect.get("x")) + float(rect.get("width")) - float(text.get("x"))
        assert len(text.text) * 6.2 < room, (text.text, room)  # 6.2 px: DejaVu Sans' mean advance at 11 px


def test_legend_wraps_inside_the_timeline_and_names_delivery_kinds():
    many = stage_rows(*[(f"backend_stage_number_{k}", 0.01, "ok") for k in range(12)], ("criu_restore", 0.01, "failed"))
    fx = pd.DataFrame([{"trial_id": "t0001", "op_id": 1, "attempt": a, "epoch": 0, "kind": "publish", "decision": "applied",
                        "arrival_seq": s} for a, s in ((1, 1), (2, 3))])
    root = parse(report.trial_timeline_svg("t0001", many, fx))
    width, height = (float(v) for v in root.get("viewBox").split()[2:])
    items = [g for g in root.iter(f"{SVG}g") if g.get("class", "").startswith("legend-item")]
    assert len(legend_stages(root)) == len(many)
    assert {g.get("data-kind") for g in items if g.get("data-kind")} == {"first", "again"}
    assert any(g.get("class") == "legend-item failed" for g in items)
    boxes = []
    for g in items:
        text = g.find(f"{SVG}text")
        x, y = float(text.get("x")), float(text.get("y"))
        boxes.append((x - 16, x + 6.5 * len(text.text), y))
        assert x + 6.5 * len(text.text) <= width and y <= height, text.text
    rows = sorted({y for *_x, y in boxes})
    assert len(rows) > 1  # wrapped
    for y in rows:
        row = sorted(b for b in boxes if b[2] == y)
        assert all(a[1] < b[0] for a, b in zip(row, row[1:])), row  # no entry runs into the next
    # A failed stage keeps its stage's colour; the failure is its red outline.
    failed = [r for r in bars(root) if "failed" in r.get("class")]
    assert len(failed) == 1 and failed[0].get("fill") == legend_stages(root)["criu_restore"]


def test_stage_colours_are_distinct_stable_and_shared():
    names = ["spawn", "reach_cut", "criu_dump", "fault_kill", "criu_restore", "run_until_crash", "run_to_end"]
    names += [f"third_party_stage_{k}" for k in range(80)]
    colours = plots.stage_colours(names)
    assert list(colours) == names and len(set(colours.values())) == len(names)
    assert {s: colours[s] for s in plots.HARNESS_COLOURS} == plots.HARNESS_COLOURS
    # A prefix of the same order gets the same colours: every timeline of a report agrees.
    assert plots.stage_colours(names[:5]) == {n: colours[n] for n in names[:5]}
    # A timeline keeps the report's colours; a stage the report's list lacks gets one nobody else has.
    drawn = legend_stages(parse(report.trial_timeline_svg("t0001", LEAVE_RUNNING, pd.DataFrame(), colours)))
    assert "fault_leave_running" not in colours and set(drawn) == set(LEAVE_RUNNING["stage"])
    assert {s: c for s, c in drawn.items() if s in colours} == {s: colours[s] for s in drawn if s in colours}
    assert drawn["fault_leave_running"] not in colours.values()


def trials_with_images(*rows: tuple[str, float, float]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Trials and timeline of ``(backend, image MB, restore s)`` rows, one restore each."""
    trials = pd.DataFrame([{"trial_id": f"t{k:04d}", "backend": b, "image_bytes": int(mb * 1e6)} for k, (b, mb, _s) in enumerate(rows)])
    timeline = pd.concat([stage_rows(("criu_dump", 0.05, "ok"), ("criu_restore", s, "ok"), trial_id=f"t{k:04d}")
                          for k, (_b, _mb, s) in enumerate(rows)], ignore_index=True)
    return trials, timeline


@pytest.fixture
def figure():
    made = []

    def draw(trials: pd.DataFrame, timeline: pd.DataFrame) -> plt.Axes:
        fig = plots.restore_time_figure(trials, timeline)
        made.append(fig)
        return fig.axes[0]

    yield draw
    for fig in made:
        plt.close(fig)


def points(ax: plt.Axes) -> list[tuple[float, float]]:
    return [tuple(p) for c in ax.collections if isinstance(c, PathCollection) for p in c.get_offsets()]


def inside(ax: plt.Axes, margin: float = 0.05) -> bool:
    """Every point at least ``margin`` of the axis span away from the left and right edges, and within the y range."""
    (x0, x1), (y0, y1) = ax.get_xlim(), ax.get_ylim()
    pad = margin * (x1 - x0)
    return all(x0 + pad <= x <= x1 - pad and y0 <= y <= y1 for x, y in points(ax))


def test_restore_plot_with_one_image_size_shows_the_times_not_a_column_at_the_edge(figure):
    # Four CRIU images a few kilobytes apart, as one workload configuration makes them.
    ax = figure(*trials_with_images(("criu", 19.5356, 0.057), ("criu", 19.5353, 0.061), ("criu", 19.5438, 0.053),
                                    ("criu", 19.5312, 0.077)))
    pts = points(ax)
    assert len(pts) == 4 and inside(ax)
    assert len({round(x, 6) for x, _y in pts}) == 4  # side by side, none hidden behind another
    assert [t.get_text() for t in ax.get_xticklabels()] == ["criu"]
    assert "19.5 MB" in ax.get_xlabel()
    assert sorted(y for _x, y in pts) == [0.053, 0.057, 0.061, 0.077]


def test_restore_plot_with_a_single_point(figure):
    ax = figure(*trials_with_images(("criu", 19.5, 0.0)))
    assert len(points(ax)) == 1 and inside(ax, margin=0.3)
    y0, y1 = ax.get_ylim()
    assert y1 > y0  # a restore timed at 0 s still has an axis to sit on
    assert "19.5 MB" in ax.get_xlabel() and "1 restore" in ax.get_xlabel()


def test_restore_plot_with_one_size_per_backend_keeps_backends_apart(figure):
    ax = figure(*trials_with_images(("criu", 8.0, 0.04), ("criu", 8.0, 0.05), ("criu_cuda_plugin", 8.1, 0.2)))
    assert [t.get_text() for t in ax.get_xticklabels()] == ["criu", "criu_cuda_plugin"]
    assert inside(ax)


def test_restore_plot_with_several_sizes_is_a_scatter_by_size(figure):
    ax = figure(*trials_with_images(("criu", 4.0, 0.02), ("criu", 20.0, 0.06), ("cuda_criu", 400.0, 0.9)))
    assert ax.get_xlabel() == "image size (MB)"
    assert sorted(x for x, _y in points(ax)) == pytest.approx([4.0, 20.0, 400.0])
    assert ax.get_xlim()[0] == 0 and ax.get_xlim()[1] > 400.0
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["criu", "cuda_criu"]


def deliveries(*rows: tuple[int, int, str]) -> pd.DataFrame:
    """Receiver rows ``(op, epoch, decision)`` in arrival order, numbered to fall inside LEAVE_RUNNING's marks."""
    return pd.DataFrame([{"trial_id": "t0001", "arrival_seq": i + 1, "op_id": op, "attempt": 1, "epoch": ep, "kind": "publish",
                          "decision": d} for i, (op, ep, d) in enumerate(rows)])


def test_the_timeline_has_a_lane_per_incarnation_and_joins_an_op_applied_twice():
    fx = deliveries((1, 0, "applied"), (2, 0, "applied"), (2, 1, "applied"), (3, 1, "applied"), (3, 1, "suppressed"))
    root = parse(report.trial_timeline_svg("t0001", LEAVE_RUNNING, fx))
    lanes = [t for t in root.iter(f"{SVG}text") if t.get("class") == "lane"]
    assert [t.text for t in lanes] == ["original (epoch 0)", "restored #1 (epoch 1)"]
    lane_y = {t.get("data-epoch"): float(t.get("y")) for t in lanes}
    ticks = [ln for ln in root.iter(f"{SVG}line") if "effect" in ln.get("class", "").split()]
    assert [(t.get("data-op"), t.get("class").split()[1]) for t in ticks] == [
        ("1", "first"), ("2", "first"), ("2", "again"), ("3", "first"), ("3", "suppressed")]
    # Each tick sits in its sender's lane.
    assert [float(t.get("y1")) + 13 for t in ticks] == [lane_y["0"], lane_y["0"], lane_y["1"], lane_y["1"], lane_y["1"]]
    [join] = [p for p in root.iter(f"{SVG}path") if p.get("class") == "dup-join"]
    assert join.get("data-op") == "2"
    [cut] = [ln for ln in root.iter(f"{SVG}line") if ln.get("class") == "cut"]
    reach = LEAVE_RUNNING[LEAVE_RUNNING["stage"] == "reach_cut"].iloc[0]
    assert float(cut.get("x1")) == pytest.approx(130 + reach["t_end"] * (1060 - 150) / LEAVE_RUNNING["t_end"].max(), abs=0.1)


def test_a_missing_op_is_a_ring_after_the_op_before_it():
    fx = deliveries((1, 0, "applied"), (2, 0, "applied"), (4, 1, "applied"))
    found = [{"kind": "missing", "op": 3, "detail": "committed by the workload, never applied"}]
    root = parse(report.trial_timeline_svg("t0001", LEAVE_RUNNING, fx, findings=found))
    [ring] = [c for c in root.iter(f"{SVG}circle") if c.get("class") == "missing"]
    op2 = [ln for ln in root.iter(f"{SVG}line") if ln.get("data-op") == "2"][0]
    assert ring.get("data-op") == "3" and float(ring.get("cx")) == pytest.approx(float(op2.get("x1")) + 6)
    assert "missing (never applied)" in [t.text for t in root.iter(f"{SVG}text")]


def test_the_static_picture_of_a_trial_is_a_png_with_a_row_per_incarnation():
    fx = deliveries((1, 0, "applied"), (2, 0, "applied"), (2, 1, "applied"))
    png = plots.trial_timeline_png(LEAVE_RUNNING, fx, title="t0001")
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    image = plt.imread(io.BytesIO(png))
    assert image.shape[1] > 600 and image[..., :3].std() > 0.05


def test_a_row_of_the_receiver_s_own_and_a_nan_epoch_get_no_lane_of_their_own():
    fx = deliveries((1, 0, "applied"), (2, -1, "refused"), (3, 1, "applied"))
    fx.loc[len(fx)] = {"trial_id": "t0001", "arrival_seq": 4, "op_id": 4, "attempt": 1, "epoch": float("nan"),
                       "kind": "publish", "decision": "applied"}
    root = parse(report.trial_timeline_svg("t0001", LEAVE_RUNNING, fx, findings=[{"kind": "nonsense"}]))
    assert [t.text for t in root.iter(f"{SVG}text") if t.get("class") == "lane"] == ["original (epoch 0)", "restored #1 (epoch 1)"]
    assert len([ln for ln in root.iter(f"{SVG}line") if "effect" in ln.get("class", "").split()]) == 4
    assert plots.trial_timeline_png(LEAVE_RUNNING, fx)[:4] == b"\x89PNG"


def test_the_static_picture_names_its_marks_in_a_legend(monkeypatch):
    figures: list = []
    monkeypatch.setattr(plots, "_png", lambda fig: figures.append(fig) or b"")
    fx = deliveries((1, 0, "applied"), (2, 0, "applied"), (2, 1, "applied"))
    plots.trial_timeline_png(LEAVE_RUNNING, fx, [{"kind": "missing", "op": 3, "detail": ""}], title="t0001")
    names = {t.get_text() for t in figures[0].axes[0].get_legend().get_texts()}
    assert {"first application", "applied again", "missing op"} <= names and "not applied" not in names
    assert set(LEAVE_RUNNING["stage"]) <= names
    plt.close(figures[0])
