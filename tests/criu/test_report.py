"""report.html in a real headless Chromium, plots and tables from stored data, regeneration (``criu``: must run in CI).

The report checks itself when it loads (every image decoded, every table with
rows, every timeline with stage bars) and writes the result on ``<body>``;
Chromium's ``--dump-dom`` gives us the page after that script ran. A
screenshot of the page is left in the test artefacts.
"""

from __future__ import annotations

import base64
import html as htmllib
import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import matplotlib.image as mpimg
import pandas as pd
import pytest

from cutbench.harness.reports import plots
from cutbench.harness.reports import html as report
from cutbench.harness.reports import summary
from cutbench.harness.store.rundir import RunDir
from tests.fixtures.run_fixtures import artifacts_dir, cli

pytestmark = pytest.mark.criu

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def chromium_binary() -> str:
    """Debian's chromium; fails under CI or `make test` (which install it), skips elsewhere."""
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    reason = "Chromium not found: run `sh .ci/provision-chromium.sh` (installs Debian's chromium)"
    if os.environ.get("CI") or os.environ.get("CUTBENCH_REQUIRE_BROWSER") == "1":
        pytest.fail(reason)
    pytest.skip(reason)


def run_chromium(html: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """Run headless Chromium on ``html`` with a fresh, empty profile."""
    with tempfile.TemporaryDirectory(prefix="cutbench-chromium-") as profile:
        return subprocess.run([chromium_binary(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *extra, html.resolve().as_uri()],
                              capture_output=True, text=True, timeout=120)


def rendered_body(html: Path) -> dict[str, str]:
    """The attributes of ``<body>`` after the page's self-check ran in Chromium."""
    proc = run_chromium(html, "--dump-dom")
    match = re.search(r"<body([^>]*)>", proc.stdout)
    assert match, f"Chromium printed no DOM (exit {proc.returncode}): {proc.stderr[-2000:]}"
    return dict(re.findall(r'([\w-]+)="([^"]*)"', match.group(1)))


def test_report_renders_every_plot_and_table_in_chromium(mixed_run: Path):
    html = mixed_run / "report.html"
    text = html.read_text()
    n_images, n_tables = text.count("<img "), text.count("<table ")
    n_timelines = text.count('<svg class="timeline"')
    trials = RunDir.open(mixed_run).table("trials")
    # Every trial of a run this small has its timeline (failing ones first).
    assert n_images == len(plots.PLOTS) and n_tables >= 5 and n_timelines == len(trials) >= 3

    body = rendered_body(html)
    assert body.get("data-render-check") == "ok", body.get("data-problems")
    assert body["data-images"] == f"{n_images}/{n_images}"
    assert body["data-tables"] == f"{n_tables}/{n_tables}"
    assert body["data-timelines"] == f"{n_timelines}/{n_timelines}"

    shot = artifacts_dir() / "report.png"
    shot.unlink(missing_ok=True)
    proc = run_chromium(html, f"--screenshot={shot}", "--window-size=1280,3000")
    assert shot.is_file(), proc.stderr[-2000:]
    pixels = mpimg.imread(shot)
    assert pixels.shape[0] == 3000 and pixels.shape[1] == 1280
    assert pixels[..., :3].std() > 0.05, "the screenshot is blank"
    # The verdict banner is the first thing on the page: red, since this run has invalid trials.
    r, g, b = pixels[20, 640, :3]
    assert r > 0.5 and g < 0.3 and b < 0.3, (r, g, b)


# Counts each timeline's marks once the page has loaded, with the drawn size of its first stage bar and
# delivery tick (a mark that does not render has no box), and whether every trial link has its target.
MARKS_JS = """<script>window.addEventListener("load", function () {
  var out = {};
  document.querySelectorAll("svg.timeline").forEach(function (s) {
    var bar = s.querySelector("rect.stage"), tick = s.querySelector("line.effect");
    out[s.id.slice(3)] = {effects: s.querySelectorAll("line.effect").length, again: s.querySelectorAll("line.effect.again").length,
      joins: s.querySelectorAll("path.dup-join").length, lanes: s.querySelectorAll("text.lane").length,
      cuts: s.querySelectorAll("line.cut").length, missing: s.querySelectorAll("circle.missing").length,
      bar_w: bar ? bar.getBoundingClientRect().width : 0, tick_h: tick ? tick.getBoundingClientRect().height : -1};
  });
  var links = Array.prototype.map.call(document.querySelectorAll('a[href^="#trial-"]'), function (a) {
    return document.getElementById(a.getAttribute("href").slice(1)) ? 1 : 0; });
  document.body.setAttribute("data-marks", JSON.stringify({svgs: out, links: links}));
});</script>"""


def test_each_timeline_draws_what_the_effects_table_holds(mixed_run: Path, tmp_path: Path):
    """In Chromium: one tick per delivery of the trial, a lane per incarnation, a red join per op applied again,
    a cut line per cut; every trial link (failing list, all-trials table) leads to a timeline on the page."""
    run = RunDir.open(mixed_run)
    trials, effects, timeline = run.table("trials"), run.table("effects"), run.table("timeline")
    probe = tmp_path / "marks.html"
    probe.write_text((mixed_run / "report.html").read_text().replace("</body>", MARKS_JS + "</body>"))
    proc = run_chromium(probe, "--dump-dom")
    match = re.search(r'data-marks="([^"]*)"', proc.stdout)
    assert match, f"the marks probe did not run (exit {proc.returncode}): {proc.stderr[-2000:]}"
    drawn = json.loads(htmllib.unescape(match.group(1)))
    assert drawn["svgs"] and drawn["links"] and all(drawn["links"]), drawn["links"]
    for tid, m in drawn["svgs"].items():
        fx = effects[effects["trial_id"] == tid]
        applied = fx[fx["decision"].isin(["applied", "committed"])]
        again = len(applied) - applied["op_id"].nunique()
        assert m["effects"] == len(fx) and m["again"] == again == m["joins"], (tid, m)
        assert m["lanes"] == max(1, fx["epoch"].nunique()), (tid, m)
        cuts = timeline[(timeline["trial_id"] == tid) & (timeline["stage"] == "reach_cut")]
        assert m["cuts"] == len(cuts), (tid, m)
        assert m["bar_w"] > 0 and (m["tick_h"] > 0 or fx.empty), (tid, m)
        missing = json.loads(trials.set_index("trial_id").loc[tid, "findings"])
        assert m["missing"] == len({f["op"] for f in missing if f["kind"] == "missing"}), (tid, m)
    dup_trials = [t for t, m in drawn["svgs"].items() if m["joins"]]
    assert dup_trials, "the mixed run has at_least_once trials with duplicates: some timeline joins them"


# Measures the page once it has loaded: its width against the viewport's, the all-trials table's box, and
# whether the table's first column stays in view when the box is scrolled to its far right.
LAYOUT_JS = """<script>window.addEventListener("load", function () {
  var de = document.documentElement, view = de.clientWidth;
  var table = document.getElementById("all-trials"), box = table.parentElement, edge = box.getBoundingClientRect();
  var m = {page: de.scrollWidth, view: view, box_right: edge.right, box_scroll: box.scrollWidth, box_client: box.clientWidth};
  // For the failure message: what sticks out of the viewport, or whose text runs out of its own box.
  m.overflowing = Array.prototype.filter.call(document.querySelectorAll("body *"), function (e) {
    if (e.closest(".table-wrap") && e !== box) { return false; }
    var spills = e.scrollWidth > e.clientWidth + 1 && getComputedStyle(e).overflowX === "visible";
    return e.getBoundingClientRect().right > view + 0.5 || spills;
  }).slice(0, 8).map(function (e) { return e.tagName + (e.id ? "#" + e.id : "") + " " + (e.textContent || "").slice(0, 40); });
  box.scrollLeft = box.scrollWidth;
  m.first_cell_left = table.tBodies[0].rows[0].cells[0].getBoundingClientRect().left - edge.left;
  document.body.setAttribute("data-layout", JSON.stringify(m));
});</script>"""


def measured_layout(page: str, tmp_path: Path, width: int) -> dict:
    """The page's layout as Chromium measures it in a window ``width`` px wide (see :data:`LAYOUT_JS`)."""
    probe = tmp_path / f"layout-{width}.html"
    probe.write_text(page.replace("</body>", LAYOUT_JS + "</body>"))
    proc = run_chromium(probe, "--dump-dom", f"--window-size={width},900")
    match = re.search(r'data-layout="([^"]*)"', proc.stdout)
    assert match, f"the layout probe did not run (exit {proc.returncode}): {proc.stderr[-2000:]}"
    return json.loads(htmllib.unescape(match.group(1)))


@pytest.mark.parametrize("width", [1400, 1024])
def test_report_is_no_wider_than_the_window(mixed_run: Path, tmp_path: Path, width: int):
    m = measured_layout((mixed_run / "report.html").read_text(), tmp_path, width)
    assert m["page"] <= m["view"], f"page {m['page']} px wide in a {m['view']} px viewport; overflowing: {m['overflowing']}"
    assert m["box_right"] <= m["view"]
    if width == 1400:
        # At 1400 px the whole all-trials table is in view, its long names wrapped rather than scrolled.
        assert m["box_scroll"] <= m["box_client"], m


def test_a_table_too_wide_for_the_window_scrolls_in_its_own_box(mixed_run: Path, tmp_path: Path):
    run = RunDir.open(mixed_run)
    trials = run.table("trials")
    # An error text without a break opportunity (a long path) cannot wrap: only scrolling can show it.
    trials.loc[trials.index[0], "error"] = "/" + "x" * 600 + "/criu.log"
    page = report.render_html({**run.meta(), "run_dir": str(mixed_run)}, trials, run.table("timeline"), run.table("effects"), {})
    m = measured_layout(page, tmp_path, 1400)
    assert m["page"] <= m["view"], f"page {m['page']} px wide in a {m['view']} px viewport; overflowing: {m['overflowing']}"
    assert m["box_scroll"] > m["box_client"]
    # Scrolled to the far right, the trial ID column is still in view.
    assert abs(m["first_cell_left"]) < 1.0, m


def test_self_check_reports_a_broken_image(mixed_run_copy: Path, tmp_path: Path):
    """The check cannot pass by construction: an image that does not decode turns it to ``failed``."""
    html = mixed_run_copy / "report.html"
    text = html.read_text()
    broken = re.sub(r"data:image/png;base64,[A-Za-z0-9+/=]+", "data:image/png;base64," + base64.b64encode(b"not a png").decode(), text, count=1)
    assert broken != text
    bad = tmp_path / "broken.html"
    bad.write_text(broken)
    body = rendered_body(bad)
    assert body["data-render-check"] == "failed"
    assert "image not decoded" in body["data-problems"]


def test_report_is_self_contained(mixed_run: Path):
    text = (mixed_run / "report.html").read_text()
    assert not re.search(r'(src|href)="(?!data:|#)', text), "the report loads something from outside itself"
    assert "<script src" not in text and "<link " not in text


def test_report_tables_match_the_stored_trials(mixed_run: Path):
    run = RunDir.open(mixed_run)
    trials = run.table("trials")
    text = (mixed_run / "report.html").read_text()
    verdict = summary.run_verdict(trials)
    assert f'data-verdict="{verdict.label}"' in text
    assert verdict.counts["invalid"] == int((trials["outcome"] == "invalid").sum()) > 0
    assert verdict.counts["valid"] > 0
    # Every failing trial is listed with the replay command of its stored trial file.
    for tid in trials.loc[trials["outcome"] == "invalid", "trial_id"]:
        assert summary.replay_command(mixed_run, tid) in text
        assert (mixed_run / "trials" / f"{tid}.json").is_file()
    # Each arm's row shows the arm's own counts.
    table = summary.rates(trials, ["arm"])
    for row in table.itertuples():
        assert re.search(rf"<td>{re.escape(row.arm)}</td><td class=\"num\">{row.trials}</td><td class=\"num\">{row.valid}</td>"
                         rf"<td class=\"num\">{row.invalid}</td>", text), row.arm


def test_cutbench_report_regenerates_everything_from_stored_data(mixed_run_copy: Path):
    for name in ("report.html", "summary.md"):
        (mixed_run_copy / name).unlink()
    shutil.rmtree(mixed_run_copy / "plots")
    proc = cli("report", str(mixed_run_copy), "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["verdict"] == "invalid" and out["counts"]["invalid"] > 0
    assert 0 < out["invalid_rate"] <= 1 and out["rate_low"] <= out["invalid_rate"] <= out["rate_high"] and out["arms"]
    assert Path(out["report"]).is_file() and Path(out["summary"]).is_file()
    assert set(out["plots"]) == set(plots.PLOTS)
    for path in out["plots"].values():
        assert Path(path).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # Replay commands name where the run is now, not where it was made.
    assert str(mixed_run_copy) in (mixed_run_copy / "summary.md").read_text()


def test_without_plots_the_report_and_summary_are_written_and_no_png_is(mixed_run_copy: Path):
    """``CUTBENCH_PLOTS=0`` (a CI gate's runs): the same report.html and summary.md, less their pictures."""
    shutil.rmtree(mixed_run_copy / "plots")
    proc = cli("report", str(mixed_run_copy), "--json", env={**os.environ, "CUTBENCH_PLOTS": "0"})
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["plots"] == {} and not (mixed_run_copy / "plots").exists()
    text = (mixed_run_copy / "report.html").read_text()
    assert "<img " not in text and text.count("<svg") >= 3 and out["counts"]["invalid"] > 0
    assert "](plots/trial-" not in (mixed_run_copy / "summary.md").read_text()


def test_bad_report_argument_exits_254(tmp_path: Path):
    proc = cli("report", str(tmp_path))
    assert proc.returncode == 254
    assert "not a cutbench run directory" in proc.stderr


def test_partial_run_is_marked_in_the_report(mixed_run: Path):
    run = RunDir.open(mixed_run)
    meta = {**run.meta(), "status": "partial"}
    html = report.render_html(meta, run.table("trials").head(1), run.table("timeline"), run.table("effects"), {})
    assert "partial run: interrupted" in html
    assert "interrupted" in summary.render(meta, run.table("trials").head(1))


def test_every_delivery_is_placed_inside_its_arrival_window(mixed_run: Path):
    """The timeline puts a delivery between the last high-water mark below its arrival number and the first at or above it."""
    run = RunDir.open(mixed_run)
    timeline, effects = run.table("timeline"), run.table("effects")
    checked = 0
    for tid, stages in timeline.groupby("trial_id"):
        fx = effects[effects["trial_id"] == tid]
        points = sorted([(t, h) for t, h in zip(stages["t_start"], stages["hwm_before"])] + list(zip(stages["t_end"], stages["hwm_after"])))
        for seq, t in zip(fx["arrival_seq"], plots.effect_times(stages, fx)):
            lo = max((pt for pt, h in points if h < seq), default=points[0][0])
            hi = min((pt for pt, h in points if h >= seq), default=points[-1][0])
            assert t is not None and lo - 1e-6 <= t <= hi + 1e-6, (tid, seq, lo, t, hi)
            checked += 1
    assert checked >= 16


def test_plots_without_data_still_render():
    empty = pd.DataFrame()
    for name, png in plots.render_all(empty, empty).items():
        assert png[:8] == b"\x89PNG\r\n\x1a\n", name


def test_rate_plot_with_every_group_size(mixed_run: Path):
    """Groups of 1..40 trials, all valid or all invalid: the Wilson bounds are exact at 0/n and n/n and the plot draws."""
    from cutbench.harness.checker.stats import wilson_interval

    for n in range(1, 41):
        assert wilson_interval(0, n)[0] == 0.0 and wilson_interval(n, n)[1] == 1.0, n
    trials = RunDir.open(mixed_run).table("trials")
    for n in (3, 6, 7):  # sizes at which the computed bound used to miss 0 by a rounding error
        many = pd.concat([trials.assign(trial_id=trials["trial_id"] + f"-{i}") for i in range(n)], ignore_index=True)
        assert plots.invalid_rate_by_phase(many)[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_support_matrix_page_renders_in_chromium_with_a_cell_per_measured_point():
    """The committed H200 matrix's report: the page checks itself, and its grid has one coloured cell per grid
    point of matrix.parquet, each linking to its entry (tool's words, replay command) unless identical."""
    from tests.conftest import REPO

    run = REPO / "results" / "reference" / "matrix"
    table = pd.read_parquet(run / "matrix.parquet")
    body = rendered_body(run / "report.html")
    assert body.get("data-render-check") == "ok", body.get("data-problems")
    dom = run_chromium(run / "report.html", "--dump-dom").stdout
    grid = dom[dom.index('id="support-matrix-table"'):]
    grid = grid[:grid.index("</table>")]
    assert grid.count('<td class="cell-') == len(table)
    for cell, n in table["cell"].value_counts().items():
        assert grid.count(f'<td class="cell-{cell}"') == n, cell
    listed = table[(table["cell"] != "identical") & (table["trial_id"] != "")]
    assert dom.count('<li id="cell-') == len(listed)
    assert "cutbench replay results/reference/matrix/trials/" in dom


def test_summary_explains_and_pictures_each_invalid_trial(mixed_run: Path):
    """summary.md: under each listed invalid trial, its story in plain words and a small picture of its timeline."""
    text = (mixed_run / "summary.md").read_text()
    trials = RunDir.open(mixed_run).table("trials")
    invalid = sorted(trials.loc[trials["outcome"] == "invalid", "trial_id"])[:20]
    assert invalid
    for tid in invalid:
        entry = text.split(f"- `{tid}`", 1)[1].split("\n- ", 1)[0]
        assert "The criu checkpoint was taken at op" in entry and "twice or more" in entry, entry
        assert f"![timeline of {tid}](plots/trial-{tid}.png)" in entry, entry
        pixels = mpimg.imread(mixed_run / "plots" / f"trial-{tid}.png")
        assert pixels.shape[1] > 600 and pixels[..., :3].std() > 0.05
