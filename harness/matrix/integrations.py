"""``cutbench matrix``: the measured CUDA support matrix, on the command line (:mod:`~cutbench.harness.integrations.cli`
adds it to the ``cutbench`` group)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from cutbench.errors import EXIT_CHECK_FAILED, EXIT_OK
from cutbench.harness.integrations.console import console, interrupted_code, progress_printer, say


@click.command()
@click.option("--probe", "probes", multiple=True, metavar="NAME",
              help="A matrix row or a probe workload (all its rows), repeatable; default: every row. --list names them.")
@click.option("--tool", "tools", multiple=True, metavar="BACKEND",
              help="A checkpoint tool (a registered backend), repeatable; default: every backend but app and restart.")
@click.option("--fault", "faults", multiple=True, type=click.Choice(["none", "kill"]),
              help="Fault after the checkpoint, repeatable; default: none and kill.")
@click.option("--out", "out", default="results", show_default=True, help="Results root directory.")
@click.option("--jobs", "jobs", default=None, metavar="N|auto", help="Trials run at once (default 1); the rows that "
              "need the GPU to themselves still run alone.")
@click.option("--from", "from_runs", multiple=True, type=click.Path(file_okay=False), metavar="RUN",
              help="Build the matrix from stored matrix runs of one machine instead of running trials (repeatable).")
@click.option("--findings", "findings", multiple=True, type=click.Path(file_okay=False, exists=True), metavar="DIR",
              help="Add the tools' lifecycle deviations found by `cutbench hunt` (its --out folder, or a folder of "
                   "them), one row per deviation per tool, to matrix.md and the report (repeatable).")
@click.option("--compare", "compare_with", nargs=2, type=click.Path(), metavar="A B",
              help="Show the cells that changed from matrix A to matrix B (run directories or matrix.parquet files), "
                   "e.g. two drivers or two tool versions.")
@click.option("--list", "list_rows", is_flag=True, help="List the matrix rows (probe, feature, cut) and exit.")
@click.option("--fail-on-wrong", is_flag=True, help="Exit 1 when a cell is restored silently wrong.")
@click.option("--json", "as_json", is_flag=True, help="Print the matrix (or comparison) as JSON.")
def matrix(probes: tuple[str, ...], tools: tuple[str, ...], faults: tuple[str, ...], out: str, jobs: str | None,
           from_runs: tuple[str, ...], findings: tuple[str, ...], compare_with: tuple[str, str] | None, list_rows: bool,
           fail_on_wrong: bool, as_json: bool) -> None:
    """The measured CUDA support matrix: every probe row through every tool, faults none and kill.

    Writes matrix.parquet and matrix.md into the run directory and a support-matrix section into its
    report.html. A cell is one of: identical (continued identically), refused (cleanly), failed (the
    tool's words), hung, wrong (restored silently wrong), unknown, not_measured (and why).
    """
    from cutbench.harness.matrix import generator as plan
    from cutbench.harness.matrix import reports as render
    from cutbench.harness.matrix import runner

    if list_rows:
        rows = plan.describe_rows()
        if as_json:
            click.echo(json.dumps(rows))
        else:
            for r in rows:
                extra = "".join([f"  [{r['min_gpus']} GPUs]" if r["min_gpus"] > 1 else "",
                                 "  [GPU alone]" if r["exclusive_gpu"] else ""])
                click.echo(f"{r['row']}\t{r['feature']}\t{r['probe']} ({r['array']}) cut {r['cut']}\t{r['description']}{extra}")
        sys.exit(EXIT_OK)
    if compare_with:
        table, env, text = runner.compare_matrices(*compare_with)
        click.echo(json.dumps({"changed": render.as_records(table), "environment": env}) if as_json else text)
        sys.exit(EXIT_OK)
    if from_runs:
        run, table = runner.from_runs(list(from_runs), findings=[Path(f) for f in findings])
    else:
        from cutbench.harness.model.scenario import parse_jobs

        progress = progress_printer(as_json)
        try:
            outcome, table = runner.run_matrix(probes, tools, faults, out,
                                               jobs=parse_jobs("--jobs", jobs) if jobs is not None else 1,
                                               progress=progress, findings=[Path(f) for f in findings])
        finally:
            progress.stop()
        run = outcome.run
        for line in run.meta().get("swept", []):
            say(f"removed, left by a run whose harness is gone: {line}", "yellow")
        if not outcome.complete:
            say(f"matrix run interrupted; partial matrix: {run.path / 'matrix.md'}", "yellow")
            sys.exit(interrupted_code())
    counts = render.counts(table)
    if as_json:
        click.echo(json.dumps({"run_dir": str(run.path), "matrix": str(run.path / "matrix.parquet"), "counts": counts,
                               "cells": render.as_records(table)}))
    else:
        console.print((run.path / "matrix.md").read_text(), highlight=False, markup=False)
        say(f"matrix: {run.path / 'matrix.parquet'}; report: {run.path / 'report.html'}")
    sys.exit(EXIT_CHECK_FAILED if fail_on_wrong and counts["wrong"] else EXIT_OK)
