"""The run's plots, as PNG bytes (matplotlib, Agg backend).

Each function takes stored tables and returns the PNG of one figure
(:func:`restore_time_figure` also hands back its open figure, whose axes
can be read as data); none writes to disk (the report hands the bytes to :class:`cutbench.harness.store.rundir.RunDir`).
A plot without data still comes back, as a figure that says what is missing,
so every report has the same set of images.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterable

import matplotlib

matplotlib.use("Agg")  # headless: never look for a display

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from cutbench.harness.model.timeline import HARNESS_STAGES  # noqa: E402
from cutbench.harness.reports.explain import sender_of, senders  # noqa: E402
from cutbench.harness.reports.summary import phase_order, rates, series_keys  # noqa: E402

DPI = 100

# The harness's own stages keep pale fixed colours so the checkpoint pipeline stands out against them.
HARNESS_COLOURS = {"spawn": "#bdbdbd", "reach_cut": "#e0e0e0", "run_to_end": "#cfe2f3", "run_until_crash": "#ffd59e"}
# Restore times whose image sizes differ by less than this fraction of the largest are shown as one size:
# a scatter over a few kilobytes of difference would read as a size trend that is not there.
ONE_SIZE_SPREAD = 0.05


def _stage_palette() -> list[str]:
    """Matplotlib's qualitative colours, strong before pale, without greys (harness stages) and reds
    (a failed stage, a duplicate delivery), so a pipeline stage never looks like either."""
    cmaps = matplotlib.colormaps
    # The qualitative maps are ListedColormaps: they have their colours as a list.
    candidates = list(cmaps["tab20"].colors[0::2]) + list(cmaps["tab20"].colors[1::2])  # type: ignore[attr-defined]
    candidates += list(cmaps["tab20b"].colors) + list(cmaps["tab20c"].colors)  # type: ignore[attr-defined]
    palette: list[str] = []
    for rgb in candidates:
        hue, sat, _val = matplotlib.colors.rgb_to_hsv(rgb)
        if sat < 0.15 or hue < 0.03 or hue > 0.97:
            continue
        hexed = matplotlib.colors.to_hex(rgb)
        if hexed not in palette:
            palette.append(hexed)
    return palette


_PALETTE = _stage_palette()


def stage_colours(stages: Iterable[str]) -> dict[str, str]:
    """A distinct hex colour for every stage name in ``stages``: the harness's stages their fixed
    :data:`HARNESS_COLOURS`, the others the next unused colour of the palette in order of first appearance.

    The assignment depends only on that order, so the report's timelines and
    the stage-time plot, given the same stage list, agree on every colour.
    """
    names = list(dict.fromkeys(str(s) for s in stages))
    taken = {n: HARNESS_COLOURS[n] for n in names if n in HARNESS_COLOURS}
    others = [n for n in names if n not in taken]
    free = [c for c in _PALETTE if c not in taken.values()]
    k = 0
    while len(free) < len(others):
        # More stages than the palette holds: hues a golden-ratio step apart (reds still skipped), one colour per stage.
        hue = (0.07 + k * 0.618034) % 1.0
        k += 1
        hexed = matplotlib.colors.to_hex(matplotlib.colors.hsv_to_rgb((hue, 0.55, 0.85)))  # type: ignore[arg-type]  # an RGB array
        if 0.03 < hue < 0.97 and hexed not in free and hexed not in taken.values():
            free.append(hexed)
    colours = dict(taken)
    for name, colour in zip(others, free):
        colours[name] = colour
    return {n: colours[n] for n in names}


def timeline_colours(timeline: pd.DataFrame) -> dict[str, str]:
    """Return :func:`stage_colours` of a run's timeline, in the order the per-trial timelines meet the stages.

    The report's timelines and the stage-time plot both call this, so they agree on every colour.
    """
    if timeline.empty:
        return {}
    return stage_colours(timeline.sort_values(["trial_id", "t_start"])["stage"])


def effect_times(stages: pd.DataFrame, effects: pd.DataFrame) -> list[float | None]:
    """Trial time of each delivery (in ``effects`` order), or None where it cannot be placed.

    Stages carry the receiver's high-water mark before and after, so a
    delivery with arrival number ``s`` arrived between the last mark below
    ``s`` and the first mark at or above it. Deliveries also carry the
    receiver's wall clock (``received_at``), whose offset to trial time is
    constant within a trial: the offset is the midpoint of what every
    delivery's window allows. Without a consistent offset (clock step, no
    ``received_at``) a delivery sits in the middle of its window.
    """
    points = sorted((float(t), float(h)) for r in stages.itertuples()
                    for t, h in ((r.t_start, r.hwm_before), (r.t_end, r.hwm_after)) if h is not None and h == h)
    if not points or effects.empty:
        return [None] * len(effects)
    windows = []
    for seq in effects["arrival_seq"].astype(float):
        lo = max((t for t, h in points if h < seq), default=points[0][0])
        hi = min((t for t, h in points if h >= seq), default=points[-1][0])
        windows.append((lo, max(lo, hi)))
    if "received_at" in effects:
        wall = effects["received_at"].astype(float).tolist()
        off_lo = max(w - hi for w, (lo, hi) in zip(wall, windows))
        off_hi = min(w - lo for w, (lo, hi) in zip(wall, windows))
        if off_lo <= off_hi:
            offset = (off_lo + off_hi) / 2
            return [w - offset for w in wall]
    return [(lo + hi) / 2 for lo, hi in windows]


def lanes(effects: pd.DataFrame) -> list[int]:
    """The incarnations that sent a trial's receiver rows (:func:`~cutbench.harness.reports.explain.sender_of`),
    in order ([0] when none is known)."""
    return sorted({e for e in senders(effects) if e is not None}) or [0]


def trial_timeline_png(stages: pd.DataFrame, effects: pd.DataFrame, findings: list[dict] | None = None,
                       colours: dict[str, str] | None = None, title: str = "") -> bytes:
    """A small static picture of one trial for ``summary.md`` readers: the report's SVG timeline in brief.

    Stage bars on the trial's clock, one lane per incarnation (the
    delivery's sender) with a tick per delivery (green first application, red applied
    again, grey suppressed), dashed lines at the cuts, and a red ring per op
    of a ``missing`` finding.
    """
    stages = stages.sort_values("t_start")
    colours = stage_colours([*(colours or {}), *stages["stage"]])
    epochs = lanes(effects)
    fig, ax = plt.subplots(figsize=(8, 1.1 + 0.35 * (len(epochs) + 1)))
    rows = {"stages": len(epochs)} | {f"epoch {e}": len(epochs) - 1 - i for i, e in enumerate(epochs)}
    for r in stages.itertuples():
        ax.barh(rows["stages"], float(r.duration_s), left=float(r.t_start), height=0.7, color=colours[r.stage],
                edgecolor="#e15759" if r.result in ("failed", "refused") else "white", label=r.stage)
        if r.stage == "reach_cut":
            ax.axvline(float(r.t_end), color="#555", linestyle="--", linewidth=0.8)
    seen: set[int] = set()
    placed: list[tuple[float, int]] = []
    if not effects.empty:
        effects = effects.sort_values("arrival_seq")
        for fx, t in zip(effects.itertuples(), effect_times(stages, effects)):
            if t is None:
                continue
            op = int(fx.op_id)
            applied = fx.decision in ("applied", "committed")
            colour = ("#d62728" if op in seen else "#2e9d4a") if applied else "#9e9e9e"
            seen |= {op} if applied else set()
            placed.append((t, op))
            sender = sender_of(fx)
            row = rows[f"epoch {sender if sender in epochs else epochs[-1]}"]
            ax.plot([t, t], [row - 0.3, row + 0.3], color=colour, linewidth=2)
    for f in findings or ():
        if f.get("kind") == "missing" and f.get("op") is not None:
            x = max((t for t, op in placed if op < int(f["op"])), default=0.0)
            ax.plot([x], [rows[f"epoch {epochs[-1]}"]], marker="o", markersize=8, markerfacecolor="none",
                    markeredgecolor="#d62728")
    ax.set_yticks(list(rows.values()), [("original (epoch 0)" if k == "epoch 0" else
                                         f"restored #{k.split()[1]} ({k})" if k.startswith("epoch") else k) for k in rows])
    ax.set_xlabel("seconds since the trial started")
    ax.set_xlim(0, max(float(stages["t_end"].max()) if not stages.empty else 0.0, 1e-3) * 1.01)
    handles, labels = ax.get_legend_handles_labels()
    unique = dict(zip(labels, handles))
    # What the marks mean, for those the picture has: a reader of summary.md has no hover text.
    from matplotlib.lines import Line2D

    kinds = {"first application": "#2e9d4a", "applied again": "#d62728", "not applied": "#9e9e9e"}
    drawn = {line.get_color() for line in ax.get_lines()}
    for label, colour in kinds.items():
        if colour in drawn:
            unique[label] = Line2D([], [], color=colour, linewidth=2)
    if "#555" in drawn:
        unique["cut"] = Line2D([], [], color="#555", linestyle="--", linewidth=0.8)
    if any(line.get_marker() == "o" for line in ax.get_lines()):
        unique["missing op"] = Line2D([], [], marker="o", markersize=7, markerfacecolor="none", markeredgecolor="#d62728",
                                      linestyle="none")
    ax.legend(unique.values(), unique.keys(), fontsize=7, ncol=min(7, len(unique)) or 1, loc="upper center",
              bbox_to_anchor=(0.5, -0.3), frameon=False, handlelength=1.2, columnspacing=1.0)
    ax.set_title(title, fontsize=9)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    return _png(fig)


def _png(fig: plt.Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def _empty_figure(title: str, message: str) -> plt.Figure:
    fig, ax = plt.subplots(figsize=(7, 2.2))
    ax.set_title(title)
    ax.text(0.5, 0.5, message, ha="center", va="center", fontsize=11, color="#555")
    ax.set_axis_off()
    return fig


def _empty(title: str, message: str) -> bytes:
    return _png(_empty_figure(title, message))


def _with_cut(trials: pd.DataFrame) -> pd.DataFrame:
    if trials.empty or "cut_phase" not in trials:
        return pd.DataFrame()
    return trials[trials["cut_phase"].notna()]


def invalid_rate_by_phase(trials: pd.DataFrame) -> bytes:
    """Invalid recovery rate per cut phase, one series per backend × receiver mode, one panel per fault,
    with Wilson 95% intervals as error bars."""
    title = "Invalid recovery rate by phase (Wilson 95% CI)"
    data = _with_cut(trials)
    if data.empty:
        return _empty(title, "no trial with a cut")
    keys = series_keys(data)
    table = rates(data, ["fault", *keys, "cut_phase"]).dropna(subset=["invalid_rate"])
    if table.empty:
        return _empty(title, "no trial had a verdict (all refused or unknown)")
    faults = sorted(table["fault"].astype(str).unique())
    phases = phase_order(data["cut_phase"], data.get("workload", ()))
    series = sorted(set(table[keys].astype(str).itertuples(index=False, name=None)))
    fig, axes = plt.subplots(1, len(faults), figsize=(max(6.0, 4.2 * len(faults)), 3.8), sharey=True, squeeze=False)
    width = 0.7 / max(1, len(series))
    for ax, fault in zip(axes[0], faults):
        sub = table[table["fault"] == fault]
        for i, key in enumerate(series):
            s = sub[(sub[keys].astype(str) == pd.Series(key, index=keys)).all(axis=1)]
            if s.empty:
                continue
            x = np.array([phases.index(p) for p in s["cut_phase"]]) + (i - (len(series) - 1) / 2) * width
            y = s["invalid_rate"].to_numpy(float)
            # Clipped: the Wilson bound of 0/n or n/n can land a rounding error past the rate itself.
            err = np.clip(np.vstack([y - s["rate_low"].to_numpy(float), s["rate_high"].to_numpy(float) - y]), 0.0, None)
            ax.errorbar(x, y, yerr=err, fmt="o", capsize=3, markersize=5, label=" / ".join(key))
        ax.set_title(f"fault: {fault}")
        ax.set_xticks(range(len(phases)), phases, rotation=35, ha="right")
        ax.set_ylim(-0.05, 1.05)
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].set_ylabel("invalid / (valid + invalid)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    for ax in axes[0][1:]:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    fig.legend(handles, labels, loc="upper center", ncol=min(4, len(labels)), bbox_to_anchor=(0.5, 1.1), frameon=False)
    fig.suptitle(title, y=1.16)
    return _png(fig)


def heatmap_phase_fault(trials: pd.DataFrame) -> bytes:
    """Invalid recovery rate per (phase, fault) cell, one panel per backend × receiver mode,
    annotated ``invalid/with verdict`` (grey: no verdict)."""
    title = "Invalid recovery rate: phase × fault"
    data = _with_cut(trials)
    if data.empty:
        return _empty(title, "no trial with a cut")
    keys = series_keys(data)
    table = rates(data, [*keys, "cut_phase", "fault"])
    phases = phase_order(data["cut_phase"], data.get("workload", ()))
    faults = sorted(table["fault"].astype(str).unique())
    panels = sorted(set(table[keys].astype(str).itertuples(index=False, name=None)))
    fig, axes = plt.subplots(1, len(panels), figsize=(1.6 + (1.0 + 1.3 * len(faults)) * len(panels), 1.4 + 0.45 * len(phases)),
                             sharey=True, squeeze=False)
    cmap = matplotlib.colormaps["Reds"].with_extremes(bad="#dddddd")
    for ax, panel in zip(axes[0], panels):
        grid = np.full((len(phases), len(faults)), np.nan)
        notes = [["" for _ in faults] for _ in phases]
        for row in table[(table[keys].astype(str) == pd.Series(panel, index=keys)).all(axis=1)].itertuples():
            i, j = phases.index(row.cut_phase), faults.index(str(row.fault))
            n = row.valid + row.invalid
            grid[i, j] = row.invalid_rate if n else np.nan
            notes[i][j] = f"{row.invalid}/{n}" if n else f"0/0 ({row.refused}r {row.unknown}u)"
        im = ax.imshow(np.ma.masked_invalid(grid), cmap=cmap, vmin=0, vmax=1, aspect="auto")
        for i in range(len(phases)):
            for j in range(len(faults)):
                dark = not np.isnan(grid[i, j]) and grid[i, j] > 0.6
                ax.text(j, i, notes[i][j], ha="center", va="center", fontsize=9, color="white" if dark else "black")
        ax.set_xticks(range(len(faults)), faults, rotation=15)
        ax.set_yticks(range(len(phases)), phases)
        ax.set_title(" / ".join(panel), fontsize=10)
        ax.set_xlabel("fault")
    axes[0][0].set_ylabel("cut after phase")
    fig.colorbar(im, ax=list(axes[0]), label="invalid rate")
    # Short figures (few phases) need the title lifted clear of the panel titles.
    fig.suptitle(title, y=1.0 + 0.45 / fig.get_figheight())
    return _png(fig)


def stage_breakdown(trials: pd.DataFrame, timeline: pd.DataFrame) -> bytes:
    """Mean time per trial in each checkpoint-pipeline stage, stacked, one bar per arm."""
    title = "Stage-time breakdown (mean seconds per trial)"
    if trials.empty or timeline.empty:
        return _empty(title, "no stage was timed")
    tl = timeline[~timeline["stage"].isin(HARNESS_STAGES) & (timeline["result"] != "event")]
    if tl.empty:
        return _empty(title, "no pipeline stage ran")
    per_trial = tl.groupby(["trial_id", "stage"], sort=False)["duration_s"].sum().unstack(fill_value=0.0)
    arms = trials.set_index("trial_id")["arm"]
    joined = per_trial.reindex(trials["trial_id"]).fillna(0.0)
    means = joined.groupby(arms.reindex(joined.index).to_numpy()).mean()
    stages = list(dict.fromkeys(tl["stage"]))
    means = means[[s for s in stages if s in means.columns]]
    fig, ax = plt.subplots(figsize=(8, 1.4 + 0.45 * len(means)))
    left = np.zeros(len(means))
    colours = timeline_colours(timeline)  # the same as the report's per-trial timelines
    for stage in means.columns:
        values = means[stage].to_numpy(float)
        ax.barh(range(len(means)), values, left=left, label=stage, color=colours[stage])
        left += values
    ax.set_yticks(range(len(means)), list(means.index))
    ax.invert_yaxis()
    ax.set_xlabel("seconds")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, fontsize=9)
    ax.set_title(title)
    ax.grid(axis="x", alpha=0.3)
    return _png(fig)


def restore_time_figure(trials: pd.DataFrame, timeline: pd.DataFrame) -> plt.Figure:
    """The open matplotlib figure of :func:`restore_time_vs_bytes` (the caller closes it).

    Restore time (every ``*restore*`` stage of a trial, summed) against image
    size, one scatter series per backend. When every image has about the same
    size (within :data:`ONE_SIZE_SPREAD`; one trial included) there is no size
    axis to speak of: the restore times are drawn as a strip per backend with
    its median, and the axis label says the size.
    """
    title = "Restore time against image size"
    if trials.empty or timeline.empty or "image_bytes" not in trials:
        return _empty_figure(title, "no restore was timed")
    restore = timeline[timeline["stage"].str.contains("restore") & (timeline["result"] == "ok")]
    seconds = restore.groupby("trial_id")["duration_s"].sum()
    data = trials.assign(restore_s=trials["trial_id"].map(seconds), image_mb=pd.to_numeric(trials["image_bytes"], errors="coerce") / 1e6)
    data = data[data["restore_s"].notna() & data["image_mb"].gt(0)]
    if data.empty:
        return _empty_figure(title, "no trial restored from an image with a known size")
    fig, ax = plt.subplots(figsize=(7, 3.8))
    low, high = float(data["image_mb"].min()), float(data["image_mb"].max())
    if high - low <= ONE_SIZE_SPREAD * high:
        groups = list(data.groupby("backend", sort=True))
        for i, (backend, g) in enumerate(groups):
            y = g["restore_s"].to_numpy(float)
            # Spread side by side (deterministically) so equal times do not hide one another.
            x = i + (np.linspace(-0.18, 0.18, len(y)) if len(y) > 1 else np.zeros(1))
            dots = ax.scatter(x, y, alpha=0.75, s=22, zorder=3)
            ax.hlines(float(np.median(y)), i - 0.28, i + 0.28, colors=dots.get_facecolor()[:1], linewidth=2)  # type: ignore[arg-type]
            if len(y) == 1:
                ax.annotate(f"{y[0]:.3f} s", (x[0], y[0]), xytext=(8, 0), textcoords="offset points", va="center", fontsize=9)
        ax.set_xticks(range(len(groups)), [str(b) for b, _g in groups])
        ax.set_xlim(-0.6, len(groups) - 0.4)
        size = f"{low:.1f} MB" if f"{low:.1f}" == f"{high:.1f}" else f"{low:.1f}–{high:.1f} MB"
        n = len(data)
        ax.set_xlabel(f"backend (every image {size}; {n} restore{'s' if n != 1 else ''}, line: median)")
        ax.grid(axis="y", alpha=0.3)
    else:
        for backend, g in data.groupby("backend", sort=True):
            ax.scatter(g["image_mb"], g["restore_s"], label=str(backend), alpha=0.75, s=22)
        ax.set_xlabel("image size (MB)")
        ax.set_xlim(0, 1.1 * high)
        ax.grid(alpha=0.3)
        ax.legend(title="backend", frameon=False)
    ax.set_ylabel("restore time (s)")
    # A floor on the extent: restores timed at 0 s must not collapse the axis.
    ax.set_ylim(0, max(1.1 * float(data["restore_s"].max()), 1e-3))
    ax.set_title(title)
    return fig


def restore_time_vs_bytes(trials: pd.DataFrame, timeline: pd.DataFrame) -> bytes:
    """PNG of restore time against checkpoint image size, per backend (see :func:`restore_time_figure`)."""
    return _png(restore_time_figure(trials, timeline))


# name -> (caption, function of (trials, timeline)); the report shows them in this order.
PLOTS: dict[str, tuple[str, Callable[[pd.DataFrame, pd.DataFrame], bytes]]] = {
    "invalid_rate_by_phase": ("Invalid recovery rate by cut phase, backend and receiver mode, with Wilson 95% intervals.",
                              lambda t, _tl: invalid_rate_by_phase(t)),
    "heatmap_phase_fault": ("Invalid recovery rate per cut phase and fault; cells say invalid / trials with a verdict.",
                            lambda t, _tl: heatmap_phase_fault(t)),
    "stage_breakdown": ("Where the time goes: mean seconds per trial in each pipeline stage, by arm.", stage_breakdown),
    "restore_vs_bytes": ("Restore time against checkpoint image size, by backend.", restore_time_vs_bytes),
}


def render_all(trials: pd.DataFrame, timeline: pd.DataFrame) -> dict[str, bytes]:
    """Every plot of :data:`PLOTS` as ``{name: png bytes}``."""
    return {name: fn(trials, timeline) for name, (_caption, fn) in PLOTS.items()}


# The criteria with numbers, each one figure in the report's criteria section.
CRITERIA_PLOTS: tuple[str, ...] = ("consistency", "speed", "correctness", "overhead")


def criteria_plot(table: pd.DataFrame, criterion: str) -> bytes:
    """One criterion of a criteria table (:func:`cutbench.harness.reports.criteria.criteria`) as bars with 95% intervals.

    One bar per backend and quantity; a panel per unit (seconds, %, ratios
    do not share an axis). Rows without a number are left out; a criterion
    with none at all says so.
    """
    rows = table[(table["criterion"] == criterion) & table["value"].notna()]
    if rows.empty:
        return _empty(f"{criterion}", "no measured value in these runs")
    units = list(dict.fromkeys(rows["unit"]))
    fig, axes = plt.subplots(len(units), 1, figsize=(8, 0.9 + 0.32 * len(rows) + 0.6 * len(units)), squeeze=False)
    for ax, unit in zip(axes[:, 0], units):
        part = rows[rows["unit"] == unit].iloc[::-1]
        labels = [f"{b} · {q}" for b, q in zip(part["backend"], part["quantity"])]
        values = part["value"].to_numpy(float)
        low = np.where(part["low"].notna(), values - part["low"].to_numpy(float), 0.0)
        high = np.where(part["high"].notna(), part["high"].to_numpy(float) - values, 0.0)
        colours = [stage_colours(sorted(rows["backend"].unique()))[b] for b in part["backend"]]
        ax.barh(labels, values, xerr=[np.maximum(low, 0), np.maximum(high, 0)], color=colours, capsize=3)
        ax.set_xlabel({"%": "percent", "s": "seconds", "ratio": "ratio (1 = equal)"}.get(unit, unit))
        if unit == "ratio":
            ax.axvline(1.0, color="#555", linewidth=0.8, linestyle="--")
        ax.tick_params(axis="y", labelsize=8)
    axes[0, 0].set_title(f"{criterion} (95% intervals where measured)")
    fig.tight_layout()
    return _png(fig)
