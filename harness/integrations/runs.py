"""Runs for code: ``cutbench.run(scenario)`` and ``cutbench.open_run(path)``, and the :class:`Run` they return.

A finished (or interrupted) run directory as pandas DataFrames and plain
values, for a notebook or a script::

    import cutbench

    run = cutbench.open_run("results/latest")
    run.counts                     # {"valid": 40, "invalid": 4, "refused": 0, "unknown": 0}
    run.rates()                    # invalid rate with Wilson 95% bounds, per arm
    run.trials[run.trials.outcome == "invalid"]
    run.findings                   # one row per finding: trial, variant, arm, plan, kind, op, detail
    len(run), list(run), run["t0007"]  # the trials by id
    run.trial("t0007")["verdict"]  # one trial's stored spec, record and verdict
    run.effects_of("t0007")        # what the receiver recorded for it
    run.compare(cutbench.open_run("results/other"))

:func:`open_run` checks the directory first, as ``cutbench analyze`` does:
a missing or damaged table, a trial file that does not belong, or a trials
table that lists other trials than ``trials/`` holds raise
:class:`cutbench.errors.InvalidArgument` naming the file. A packed run
(``cutbench pack``: the trial files in one ``trials.tar.xz``) reads the same,
and a damaged archive is named likewise. Nothing here writes:
:meth:`Run.reanalyze` recomputes verdicts in memory.

Code reaches these names through :mod:`cutbench.api` (``cutbench.open_run``,
``cutbench.api.Run``), which imports this module on first use: it loads pandas.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from functools import cached_property
from pathlib import Path
from typing import Any

import pandas as pd

from cutbench.errors import InvalidArgument
from cutbench.harness.reports import compare as _compare
from cutbench.harness.reports import explain as _explain
from cutbench.harness.reports import summary as _summary
from cutbench.harness.store import analysis as _analysis
from cutbench.harness.store.rundir import RunDir, read_matrix

__all__ = ["Run", "open_run", "run", "Comparison", "Reanalysis", "RunVerdict"]

# Columns of trials.parquet stored as JSON, and what an empty cell reads as.
JSON_COLUMNS: dict[str, type] = {"findings": list, "startup": dict, "measures": dict}

Comparison = _compare.Comparison
Reanalysis = _analysis.Reanalysis
RunVerdict = _summary.RunVerdict


class Run:
    """One stored run, read lazily: each table is read on first use and kept (see :func:`open_run`)."""

    def __init__(self, store: RunDir, records: list[dict[str, Any]]):
        self._store = store
        self._records = {r["spec"]["trial_id"]: r for r in records}

    def __repr__(self) -> str:
        return f"<cutbench run {self.run_id}: {len(self.trials)} trials, {self.verdict.label}>"

    # -- what the run is -------------------------------------------------------
    @property
    def path(self) -> Path:
        """The run directory (``results/latest`` resolved)."""
        return self._store.path

    @property
    def run_id(self) -> str:
        """The run's id (``20261202T014646Z-quick-84e4``)."""
        return str(self.meta.get("run_id", self._store.run_id))

    @cached_property
    def meta(self) -> dict[str, Any]:
        """All of ``run.toml``: status (``complete`` or ``partial``), environment, planned arms, the scenario."""
        return self._store.meta()

    @property
    def scenario(self) -> dict[str, Any]:
        """The resolved scenario the run ran (the ``[scenario]`` table of ``run.toml``)."""
        return dict(self.meta.get("scenario") or {})

    @property
    def complete(self) -> bool:
        """False for a run that was interrupted (``status = "partial"``)."""
        return self.meta.get("status") == "complete"

    # -- the run as a collection of trials ----------------------------------------
    def __len__(self) -> int:
        """The number of trials stored."""
        return len(self._records)

    def __iter__(self) -> Iterator[str]:
        """The trial ids, in trial order (``run[trial_id]`` is that trial's stored file)."""
        return iter(self._records)

    def __contains__(self, trial_id: object) -> bool:
        return trial_id in self._records

    def __getitem__(self, trial_id: str) -> dict[str, Any]:
        """``run["t0007"]`` is :meth:`trial`."""
        return self.trial(trial_id)

    # -- tables ----------------------------------------------------------------
    @cached_property
    def _stored_trials(self) -> pd.DataFrame:
        return self._store.table("trials")

    @cached_property
    def trials(self) -> pd.DataFrame:
        """One row per trial: arm, plan, status, outcome, finding counts, stage timings (``trials.parquet``), with
        its JSON columns as Python values: ``findings`` a list of ``{"kind", "op", "detail"}``, ``startup`` and
        ``measures`` dicts."""
        table = self._stored_trials.copy()
        for column, empty in JSON_COLUMNS.items():
            if column in table:
                table[column] = [json.loads(v) if isinstance(v, str) and v else empty() for v in table[column]]
        return table

    @cached_property
    def findings(self) -> pd.DataFrame:
        """One row per finding of every trial: ``trial_id``, ``variant``, ``arm``, ``plan``, ``outcome``, then the
        finding's ``kind``, ``op`` and ``detail``, in trial order."""
        keys = [c for c in ("trial_id", "variant", "arm", "plan", "outcome") if c in self.trials]
        rows = [{**{k: row[k] for k in keys}, "kind": f.get("kind"), "op": f.get("op"), "detail": f.get("detail", "")}
                for row in self.trials.to_dict("records") for f in row.get("findings") or []]
        return pd.DataFrame(rows, columns=[*keys, "kind", "op", "detail"]).astype({"op": "Int64"})

    @cached_property
    def timeline(self) -> pd.DataFrame:
        """One row per stage or event of every trial, seconds since the trial's start, with each stage's
        CPU-seconds by process role, faults and bytes written (``timeline.parquet``; docs/cpu-accounting.md: NaN
        in a run stored before them)."""
        return self._store.table("timeline")

    @cached_property
    def effects(self) -> pd.DataFrame:
        """Every delivery the receiver recorded, with its decision and ``trial_id`` (``effects.parquet``)."""
        return self._store.table("effects")

    @cached_property
    def certificates(self) -> pd.DataFrame:
        """One row per recovery-cut certificate (empty for a run without ``pipeline.certify``)."""
        return self._store.table("certificates")

    @cached_property
    def matrix(self) -> pd.DataFrame:
        """The CUDA support matrix of a ``cutbench matrix`` run (empty for any other run)."""
        return read_matrix(self.path) if (self.path / "matrix.parquet").exists() else pd.DataFrame()

    # -- one trial -------------------------------------------------------------
    @property
    def trial_ids(self) -> list[str]:
        """Every trial's id, in trial order."""
        return list(self._records)

    def trial(self, trial_id: str) -> dict[str, Any]:
        """Trial ``trial_id``'s stored file (loose or packed): ``spec`` (what ``cutbench replay`` reruns), ``record``
        and ``verdict``.

        :class:`InvalidArgument` when the run has no such trial (with the ids it has).
        """
        try:
            return self._records[trial_id]
        except KeyError:
            ids = list(self._records)
            raise InvalidArgument(f"{self.path}: no trial {trial_id!r}; it has {len(ids)} "
                                  f"({', '.join(ids[:3])}{' …' if len(ids) > 3 else ''})") from None

    def effects_of(self, trial_id: str) -> pd.DataFrame:
        """The receiver's rows of one trial, in arrival order."""
        self.trial(trial_id)  # an unknown id is an error, not an empty frame
        fx = _analysis.trial_effects(self.effects, trial_id)
        return fx.sort_values("arrival_seq") if "arrival_seq" in fx else fx

    def timeline_of(self, trial_id: str) -> pd.DataFrame:
        """The stages and events of one trial, in start order."""
        self.trial(trial_id)
        tl = self.timeline
        return tl[tl["trial_id"] == trial_id].sort_values("t_start") if not tl.empty else tl

    def explain(self, trial_id: str) -> str:
        """Trial ``trial_id``'s verdict in plain words, as the report gives it beside its timeline ("" when valid)."""
        self.trial(trial_id)
        row = self.trials[self.trials["trial_id"] == trial_id].iloc[0].to_dict()
        return _explain.explain(row, self.effects_of(trial_id),
                                resume=_explain.resume_flag(self.meta, str(row.get("variant") or "")))

    # -- verdicts --------------------------------------------------------------
    @property
    def verdict(self) -> RunVerdict:
        """The run's headline, as ``summary.md`` and the exit code give it: label, invalid rate and Wilson bounds."""
        return _summary.run_verdict(self.trials, self.meta)

    @property
    def counts(self) -> dict[str, int]:
        """Trials per outcome: ``valid``, ``invalid``, ``refused``, ``unknown`` (zeros included)."""
        return dict(self.verdict.counts)

    def rates(self, by: list[str] | None = None) -> pd.DataFrame:
        """Per group (default: per arm, and per sweep variant where there are several): trials, outcome counts,
        finding totals and the invalid rate with its Wilson 95% interval (``invalid_rate``, ``rate_low``, ``rate_high``)."""
        return _summary.rates(self.trials, by or _summary.group_columns(self.trials))

    def failing(self, limit: int | None = None) -> pd.DataFrame:
        """The invalid trials, then the unknown ones, in trial order (the first ``limit``)."""
        return _summary.failing_trials(self.trials, limit)

    def compare(self, other: "Run | str | Path") -> Comparison:
        """Return ``other`` beside this run on the plans both ran (as ``cutbench compare THIS OTHER``): per-plan
        changes (``regressions``: valid here, invalid there), rates per group and stage timings."""
        other = other if isinstance(other, Run) else open_run(other)
        return _compare.compare(self._stored_trials, other._stored_trials, f"{self.run_id} ({self.path})", f"{other.run_id} ({other.path})")

    def verdicts(self) -> dict[tuple[str, str, str], tuple[str, tuple[str, ...]]]:
        """Per ``(variant, arm, plan)``: its outcome and the kinds of its findings. Two runs of the same plans (by
        any executor, or a run and its resumed copy) must give equal ones."""
        return _analysis.verdicts_by_plan(self._stored_trials)

    def reanalyze(self) -> Reanalysis:
        """Every verdict recomputed from the stored data by the current oracle (as ``cutbench analyze``);
        ``.differences`` lists the trials whose verdict changed."""
        return _analysis.reanalyze(self._store)


def _interrupted(run_dir: Path) -> KeyboardInterrupt:
    """The ``KeyboardInterrupt`` a run from code raises on after storing its partial run: ``run_dir`` names it."""
    exc = KeyboardInterrupt(f"interrupted; the partial run is stored in {run_dir}")
    setattr(exc, "run_dir", run_dir)  # an interrupt is no error type of ours: the path rides on the builtin one
    return exc


def run(scenario: "str | Path | Any", *, out: str | Path = "results", overrides: "list[str] | tuple[str, ...]" = (),
        variants: "list[str] | tuple[str, ...]" = (),
        progress: "Callable[[str, str, int, int], None] | None" = None) -> Run:
    """Run ``scenario`` (a scenario file, or a ``Scenario`` already loaded) as ``cutbench run`` does and return the
    stored run, as :func:`open_run` gives it.

    ``overrides`` are ``--set`` strings (``"plan.trials=4"``), applied to a file; ``variants`` picks
    ``[[variants]]`` by name. ``progress(trial_id, outcome, done, total)`` is called in this thread as each
    trial finishes (a progress bar; a ``KeyboardInterrupt`` it raises stops the run as Ctrl-C does). Raises
    :class:`cutbench.errors.InvalidArgument` or ``Unavailable`` where the command exits 254 (a bad field,
    nothing that can run here); a Ctrl-C stores the partial run and is raised on as ``KeyboardInterrupt``,
    whose ``run_dir`` is the stored run's path (an interrupt before the run directory existed has none). The
    run's exit code is ``Run.verdict``'s: nothing is printed.
    """
    from cutbench.harness.model.scenario import Scenario, load_scenario, select_variants
    from cutbench.harness.runner.run import run_scenario

    if isinstance(scenario, Scenario):
        if overrides:
            raise InvalidArgument("overrides apply to a scenario file; a loaded Scenario is changed with dataclasses.replace")
        scen = scenario
    else:
        scen = load_scenario(scenario, list(overrides))
    tell = None if progress is None else (
        lambda result, done, total: progress(result.spec.trial_id, result.verdict.outcome, done, total))
    outcome = run_scenario(select_variants(scen, tuple(variants)), out, progress=tell)
    if not outcome.complete:
        raise _interrupted(outcome.run.path)
    return open_run(outcome.run.path)


def matrix(probes: "list[str] | tuple[str, ...]" = (), tools: "list[str] | tuple[str, ...]" = (),
           faults: "list[str] | tuple[str, ...]" = (), *, out: str | Path = "results", jobs: int | str = 1) -> Run:
    """Measure the support matrix of ``probes`` (row or probe names; none: all) × ``tools`` × ``faults`` as
    ``cutbench matrix`` does, and return the stored run (its table is ``Run.matrix``).

    Bad names raise :class:`cutbench.errors.InvalidArgument` before anything runs; a Ctrl-C stores the partial
    run and is raised on as ``KeyboardInterrupt`` (its ``run_dir`` names the run, as :func:`run`'s does).
    """
    from cutbench.harness.matrix.runner import run_matrix

    outcome, _ = run_matrix(tuple(probes), tuple(tools), tuple(faults), out, jobs=jobs)
    if not outcome.complete:
        raise _interrupted(outcome.run.path)
    return open_run(outcome.run.path)


def open_run(path: str | Path) -> Run:
    """The run stored at ``path`` (a run directory, or ``results/latest``), checked; returns a :class:`Run`.

    Raises :class:`cutbench.errors.InvalidArgument` naming the file when
    ``path`` is not a run directory or the run is damaged.
    """
    store = RunDir.open(path)
    return Run(store, _analysis.check_run(store))
