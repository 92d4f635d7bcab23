"""Pure summaries of a trials table: rates per group, the run's verdict, the markdown summary.

Everything here takes frames and dicts and returns frames, dicts and text;
the report, the comparison, the CLI and the pytest plugin all read their
numbers from these functions so that they never disagree.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from cutbench.harness.nemesis import CHECKPOINTERS, Backends
from cutbench.harness.checker.stats import certificate_matrix, invalid_rate
from cutbench.harness.model.plan import CutPlan
from cutbench.harness.model.trial import FINDING_KINDS, OUTCOMES
from cutbench.harness.reports.explain import explain, parse_findings, resume_flag, suggested_option
from cutbench.workloads.api import DOMAINS
from cutbench.workloads.control import PHASES


@dataclass(frozen=True)
class RunVerdict:
    """The headline of a run: a label, the invalid recovery rate with its Wilson 95% bounds, outcome counts."""

    label: str  # "invalid" | "valid" | "partial" | "unknown" | "empty"
    text: str
    rate: float
    low: float
    high: float
    counts: dict[str, int]
    not_run: tuple[str, ...] = ()  # arms of an interrupted run with no finished trial

    @property
    def with_verdict(self) -> int:
        """Trials that had a verdict (valid + invalid): the rate's denominator."""
        return self.counts["valid"] + self.counts["invalid"]


def refusals_expected(meta: dict[str, Any] | None) -> bool:
    """Whether the run's scenario (``run.toml``'s, or any of its variants) says a run of refusals is the answer."""
    scen = (meta or {}).get("scenario") or {}
    return bool(scen.get("expect_refusals")) or any(v.get("expect_refusals") for v in scen.get("variants") or [])


def run_verdict(trials: pd.DataFrame, meta: dict[str, Any] | None = None) -> RunVerdict:
    """The run's verdict from its trials table (``outcome`` column) and, when given, its ``run.toml``.

    An interrupted run (``status = "partial"``) is never shown as all valid:
    without an invalid trial its label is ``partial`` and it names the
    planned arms that have no finished trial.
    """
    counts = {k: 0 for k in OUTCOMES}
    if not trials.empty:
        for key, n in trials["outcome"].value_counts().items():
            counts[str(key)] = int(n)
    rate, lo, hi = invalid_rate(counts["invalid"], counts["valid"])
    if trials.empty:
        label, text = "empty", "no trial finished"
    elif counts["invalid"]:
        label, text = "invalid", "INVALID recoveries found"
    elif counts["valid"]:
        label, text = "valid", "all recoveries valid"
    elif counts["unknown"]:
        label, text = "unknown", "no verdict (unknown only)"
    elif refusals_expected(meta):
        label, text = "valid", "every cut refused cleanly, as the scenario expects (pipeline.expect_refusals)"
    else:
        label, text = "unknown", ("every cut was refused, so nothing was tested (set pipeline.expect_refusals = true "
                                  "where refusing is the answer sought)")
    not_run: tuple[str, ...] = ()
    if meta is not None and meta.get("status") == "partial":
        ran = set(trials["arm"]) if not trials.empty and "arm" in trials else set()
        not_run = tuple(a for a in meta.get("arms_planned", []) if a not in ran)
        if label != "invalid":
            label = "partial"
            text = (f"partial run (interrupted): {len(trials)} of {meta.get('n_trials_planned', '?')} planned trials, "
                    f"{'no invalid recovery among them' if counts['valid'] else 'no verdict'}")
            if not_run:
                text += f"; arms not run: {', '.join(not_run)}"
    return RunVerdict(label, text, rate, lo, hi, counts, not_run)


def figures(trials: pd.DataFrame) -> dict[str, Any]:
    """Return what a CI job reads of a run (``run --json``, ``report --json``): the invalid recovery rate with
    its Wilson 95% bounds, and the same figures per arm under ``arms`` (NaN as None: JSON has no NaN)."""
    v = run_verdict(trials)
    nan = v.rate != v.rate
    out: dict[str, Any] = {"invalid_rate": None if nan else v.rate, "rate_low": v.low, "rate_high": v.high}
    if not trials.empty:
        table = rates(trials, ["arm"])
        out["arms"] = [{k: (None if isinstance(val, float) and val != val else val) for k, val in row.items()}
                       for row in table.to_dict("records")]
    return out


def group_columns(trials: pd.DataFrame) -> list[str]:
    """How trials are grouped in tables: by ``arm``, and first by sweep ``variant`` when a run has several."""
    if "variant" in trials and trials["variant"].fillna("").astype(str).str.len().gt(0).any():
        return ["variant", "arm"]
    return ["arm"]


def phase_order(phases: list[str] | pd.Series, workloads: list[str] | pd.Series = ()) -> list[str]:
    """The phases present, in the lifecycle order of ``workloads`` (their own phase lists, e.g. with
    ``send`` or ``outbox``), then the standard order; phases nobody declares come last."""
    lifecycle: list[str] = []
    for name in dict.fromkeys(str(w) for w in workloads):
        try:
            from cutbench.workloads import api

            lifecycle += [p for p in api.load(name).phases if p not in lifecycle]
        except Exception:  # a workload this build no longer has: fall back to the standard order
            continue
    lifecycle += [p for p in PHASES if p not in lifecycle]
    present = list(dict.fromkeys(str(p) for p in phases if isinstance(p, str)))
    return [p for p in lifecycle if p in present] + [p for p in present if p not in lifecycle]


def series_keys(trials: pd.DataFrame) -> list[str]:
    """The columns one series of a plot (or one row group of a table) is drawn per: backend and receiver mode,
    and first the variant when the run has several (a correct and a buggy twin are never pooled)."""
    return [*group_columns(trials)[:-1], "backend", "receiver_mode"]


def rates(trials: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """Per group: trials, outcome counts, finding totals and invalid rate with Wilson 95% bounds; a ``cut_phase``
    group in the workloads' lifecycle order (:func:`phase_order`), the others sorted."""
    if trials.empty:
        return pd.DataFrame()
    rows = []
    for key, g in trials.groupby(by, dropna=False, sort=True):
        key = key if isinstance(key, tuple) else (key,)
        counts = g["outcome"].value_counts()
        valid, invalid = int(counts.get("valid", 0)), int(counts.get("invalid", 0))
        rate, lo, hi = invalid_rate(invalid, valid)
        row: dict[str, Any] = dict(zip(by, key))
        row.update(
            trials=len(g),
            valid=valid,
            invalid=invalid,
            refused=int(counts.get("refused", 0)),
            unknown=int(counts.get("unknown", 0)),
            invalid_rate=rate,
            rate_low=lo,
            rate_high=hi,
        )
        for kind in FINDING_KINDS:
            if kind in g:
                row[kind] = int(g[kind].sum())
        rows.append(row)
    out = pd.DataFrame(rows)
    if "cut_phase" in by and not out.empty:
        order = {p: i for i, p in enumerate(phase_order(trials["cut_phase"].dropna(), trials.get("workload", ())))}
        out = out.sort_values(by, key=lambda s: s.map(order) if s.name == "cut_phase" else s, kind="stable",
                              ignore_index=True)
    return out


def compact_rates(table: pd.DataFrame) -> pd.DataFrame:
    """A :func:`rates` table made readable: one rate column with its 95% interval, one column naming the findings."""
    out = table.copy()
    out["invalid rate (95% CI)"] = [f"{pct(r)} ({pct(lo)}–{pct(hi)})" for r, lo, hi in zip(out["invalid_rate"], out["rate_low"], out["rate_high"])]
    kinds = [k for k in FINDING_KINDS if k in out]
    out["findings"] = [", ".join(f"{k} {int(rec[k])}" for k in kinds if rec[k]) for rec in out.to_dict("records")]
    return out.drop(columns=["invalid_rate", "rate_low", "rate_high", *kinds])


def finding_totals(trials: pd.DataFrame) -> dict[str, int]:
    """Total findings per kind over the run (every kind present, zeros included)."""
    return {k: int(trials[k].sum()) if k in trials else 0 for k in FINDING_KINDS}


def replay_command(run_dir: Any, trial_id: str) -> str:
    """The shell command that reruns one stored trial."""
    return f"cutbench replay {shlex.quote(f'{run_dir}/trials/{trial_id}.json')}"


def failing_trials(trials: pd.DataFrame, limit: int | None = None) -> pd.DataFrame:
    """Invalid trials first, then unknown ones, in trial order (the first ``limit``)."""
    if trials.empty:
        return trials
    bad = trials[trials["outcome"].isin(["invalid", "unknown"])]
    bad = bad.assign(_rank=(bad["outcome"] != "invalid").astype(int)).sort_values(["_rank", "trial_id"]).drop(columns="_rank")
    return bad if limit is None else bad.head(limit)


def findings_text(row: dict[str, Any], limit: int = 5) -> str:
    """One line naming a trial row's findings (``duplicate op 3 (applied 2 times); …``), else its error."""
    found = parse_findings(row.get("findings"))
    text = "; ".join(f"{f['kind']}" + (f" op {f['op']}" if f.get("op") is not None else "") + f" ({f.get('detail', '')})" for f in found[:limit])
    if len(found) > limit:
        text += f"; … {len(found) - limit} more"
    return text or (row.get("error") or "no finding recorded")


def pct(x: float) -> str:
    """A rate as a percentage with one decimal ("n/a" for NaN)."""
    return "n/a" if x != x else f"{100 * x:.1f}%"


FAILING_LISTED = 20  # failing trials summary.md lists (and draws, when invalid)


def trial_picture(trial_id: str) -> str:
    """Where a trial's static timeline picture is, relative to the run directory."""
    return f"plots/trial-{trial_id}.png"


def render(meta: dict[str, Any], trials: pd.DataFrame, effects: pd.DataFrame | None = None,
           pictures: set[str] | frozenset[str] = frozenset()) -> str:
    """The ``summary.md`` text for a run: with ``effects``, each failing trial is explained in plain words;
    the trials in ``pictures`` get their timeline picture (:func:`trial_picture`) under their entry."""
    scen = meta.get("scenario", {})
    run_dir = meta.get("run_dir", "results/" + str(meta.get("run_id")))
    lines = [f"# cutbench run {meta.get('run_id', '')}", ""]
    lines.append(f"- scenario: `{scen.get('name', '')}` ({scen.get('source_path', '')})")
    status = meta.get("status", "")
    note = " — interrupted, the trials below are those that finished" if status == "partial" else ""
    if meta.get("first_invalid"):  # run.stop_at_first_invalid: why fewer trials ran than were planned
        note += f" — stopped at its first invalid trial, number {meta['first_invalid']} in plan order (run.stop_at_first_invalid)"
    lines.append(f"- status: **{status}**{note}, {len(trials)} of {meta.get('n_trials_planned', '?')} trials, {meta.get('duration_s', 0):.1f} s")
    crit = meta.get("environment", {}).get("criu", {})
    if crit:
        lines.append(f"- CRIU {crit.get('version')} ({crit.get('source')})")
    for axis, values in (meta.get("sweep") or {}).get("axes", {}).items():
        lines.append(f"- sweep axis `{axis}`: {', '.join(map(str, values))}")
    for key, where in (meta.get("boundaries_differ") or {}).items():
        lines.append(f"- the uninterrupted runs' counted system calls differ ({key}) at {where}: a cut there or "
                     "beyond lands on the call its own run makes (its trial's `boundary_landed` says which)")
    for event in meta.get("receiver_restarts", []):
        again = ", ".join(event.get("trials_rerun", [])) or "none"
        lines.append(f"- the receiver died (exit status {event.get('exit_status')}) and "
                     + (f"was started again on its store after {event['restarted_after_s']:g} s; trials run again: {again}"
                        if "restarted_after_s" in event else "could not be started again"))
    if trials.empty:
        skipped = meta.get("skipped_arms", [])
        if skipped and status == "complete":
            lines += ["", f"**Nothing was tested**: every one of the {len(skipped)} arms was skipped, so no trial ran:", ""]
            lines += [f"- {s['arm']}: {s['reason']}" for s in skipped]
        else:
            lines += ["", "No trial finished."]
        return "\n".join(lines) + "\n"
    v = run_verdict(trials, meta)
    lines += ["", f"**{v.text}** — invalid recovery rate {pct(v.rate)} (95% CI {pct(v.low)}–{pct(v.high)}); "
              + ", ".join(f"{k} {v.counts[k]}" for k in OUTCOMES), ""]
    by = group_columns(trials)
    table = compact_rates(rates(trials, by))
    lines += ["## By " + " and ".join(by), "", table.to_markdown(index=False), ""]
    for skipped in meta.get("skipped_arms", []):
        lines.append(f"- skipped {skipped['arm']}: {skipped['reason']}")
    lines += render_refusals(trials)
    lines += render_certificates(trials)
    bad = failing_trials(trials, FAILING_LISTED)
    if not bad.empty:
        lines += ["## First invalid or unknown trials", ""]
        for row in bad.itertuples():
            variant = f"{row.variant}: " if getattr(row, "variant", "") else ""
            lines.append(f"- `{row.trial_id}` {variant}{row.arm} {row.plan}: **{row.outcome}** {row.error or ''} "
                         f"— replay: `{replay_command(run_dir, row.trial_id)}`")
            words = explain(row._asdict(), effects, resume=resume_flag(meta, getattr(row, "variant", ""))) \
                if effects is not None else ""
            if words:
                lines.append(f"  {words}")
            if getattr(row, "last_words", ""):
                lines.append("  The workload's last words:")
                lines += ["", "  ```", *(f"  {line}" for line in row.last_words.splitlines()), "  ```", ""]
            if row.trial_id in pictures:
                lines.append(f"  ![timeline of {row.trial_id}]({trial_picture(row.trial_id)})")
    return "\n".join(lines) + "\n"


REFUSALS_LISTED = 10  # distinct refusal reasons summary.md lists


def refusal_groups(trials: pd.DataFrame) -> list[dict[str, Any]]:
    """The refused trials grouped by what the tool said (its words, with CRIU's pid prefixes taken out, which
    differ from trial to trial), most frequent first: each ``{"reason", "trials", "arms", "fix"}``, ``fix`` the
    tool's own suggestion as the scenario's fix (:func:`suggested_option`) or ""."""
    if trials.empty or "outcome" not in trials:
        return []
    groups: dict[str, dict[str, Any]] = {}
    for row in trials[trials["outcome"] == "refused"].to_dict("records"):
        reason = " ".join(PID_PREFIX.sub("", str(row.get("error") or "no reason given")).split())
        group = groups.setdefault(reason, {"reason": reason, "trials": [], "arms": [], "fix": ""})
        group["trials"].append(row["trial_id"])
        group["arms"] += [row["arm"]] if row["arm"] not in group["arms"] else []
        group["fix"] = group["fix"] or suggested_option(reason, str(row.get("criu_options") or ""))
    return sorted(groups.values(), key=lambda g: (-len(g["trials"]), g["trials"][0]))


# CRIU's log lines begin with the pid of the criu process that wrote them ("5269: Error (criu/…)").
PID_PREFIX = re.compile(r"(?<!exit )(?<![\w/])\d+: (?=Error|Warn)")


def render_refusals(trials: pd.DataFrame) -> list[str]:
    """Return ``summary.md``'s section on the refused trials: each distinct reason in the tool's words, with its trials and
    arms and the tool's own suggestion; nothing when no trial was refused."""
    groups = refusal_groups(trials)
    if not groups:
        return []
    lines = ["## Refused trials", ""]
    for g in groups[:REFUSALS_LISTED]:
        ids = ", ".join(g["trials"][:5]) + (f", … {len(g['trials']) - 5} more" if len(g["trials"]) > 5 else "")
        lines.append(f"- {len(g['trials'])} trial{'s' * (len(g['trials']) > 1)} ({ids}; {', '.join(g['arms'])}): "
                     f"{g['reason']}" + (f" — {g['fix']}" if g["fix"] else ""))
    if len(groups) > REFUSALS_LISTED:
        lines.append(f"- … {len(groups) - REFUSALS_LISTED} more reasons (trials.parquet's `error` column)")
    return lines + [""]


def certificate_grid(m: dict[str, Any]) -> list[dict[str, Any]]:
    """The confusion matrix of :func:`~cutbench.harness.checker.stats.certificate_matrix` as rows (claim × verdict)."""
    return [{"certificate": name, **{o: m[f"{name}_{o}"] for o in ("valid", "invalid", "refused", "unknown")}}
            for name in ("eligible", "ineligible")]


def certificate_sentences(m: dict[str, Any]) -> list[str]:
    """Soundness, over-refusal and the enforced restores, one sentence each (Markdown code spans)."""
    s, o = m["soundness"], m["over_refusal"]
    return [f"soundness: invalid among eligible {pct(s[0])} (95% CI {pct(s[1])}–{pct(s[2])}); must be 0",
            f"over-refusal: ineligible among valid {pct(o[0])} (95% CI {pct(o[1])}–{pct(o[2])}) (restored under `audit` only)",
            f"`enforce`: {m['enforce_accepted_invalid']} invalid among {m['enforce_accepted']} accepted restores"]


def render_certificates(trials: pd.DataFrame) -> list[str]:
    """The ``summary.md`` lines on recovery-cut certificates and effect fences (none when the run had neither)."""
    lines: list[str] = []
    m = certificate_matrix(trials)
    if m["certified"]:
        lines += ["## Recovery-cut certificates", "",
                  "| certificate \\ verdict | valid | invalid | refused | unknown |", "|:--|--:|--:|--:|--:|"]
        for row in certificate_grid(m):
            lines.append("| " + " | ".join(str(v) for v in row.values()) + " |")
        lines += [""] + [f"- {s}" for s in certificate_sentences(m)] + [""]
    if "release_latency_median_s" in trials and trials["release_latency_median_s"].notna().any():
        fenced = trials[trials["release_latency_median_s"].notna()]
        lines += ["## Effect fences", "",
                  f"- effect release latency (prepare → commit) over {len(fenced)} fenced trials: median of trial medians "
                  f"{fenced['release_latency_median_s'].median():.3f} s, worst trial p99 {fenced['release_latency_p99_s'].max():.3f} s", ""]
    return lines


def render_search(search: dict[str, Any], run_path: Path) -> str:
    """The Markdown section of ``summary.md`` that reports the search per arm."""
    lines = [f"## Hypothesis search (profile `{search['profile']}`)", "",
             "| arm | trials | first failure at trial | minimal failing plan | cuts | reproduced |",
             "|:--|--:|--:|:--|--:|:--|"]
    for a in search["arms"]:
        plan = CutPlan.from_dict(a["minimal_plan"]).describe() if a.get("minimal_plan") else "—"
        repro = {True: "yes", False: "flaky", None: "—"}[a.get("reproduced")]
        lines.append(f"| {a['arm']} | {a['trials']} | {a.get('first_failure') or '—'} | {plan} | {a.get('minimal_cuts') or '—'} | {repro} |")
    for a in search["arms"]:
        if a.get("minimal_trial"):
            lines.append(f"\n- replay `{a['arm']}`'s minimal plan: `cutbench replay {run_path / 'trials' / (a['minimal_trial'] + '.json')}`")
        if a.get("flaky"):
            lines.append(f"- `{a['arm']}`: {a['flaky']}")
    return "\n".join(lines)


def render_coverage() -> str:
    """The backend × state-domain table as Markdown: what each registered backend's checkpoint holds.

    Read from each backend's declared ``Capabilities.covers`` (nothing typed in
    twice); ``receiver`` is the outside world, which no checkpoint holds. A
    restore of a workload that uses a domain its backend does not hold is an
    ``unsafe_acceptance``.
    """
    rows = ["| backend | " + " | ".join(f"`{d}`" for d in DOMAINS) + " |",
            "|---|" + "|".join(":-:" for _ in DOMAINS) + "|"]
    backends = Backends()
    for name in CHECKPOINTERS.names():
        covers = backends.capabilities(name).covers
        rows.append(f"| `{name}` | " + " | ".join("✓" if d in covers else "–" for d in DOMAINS) + " |")
    return "\n".join(rows)
