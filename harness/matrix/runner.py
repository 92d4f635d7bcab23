"""``cutbench matrix``: run every probe row through every tool, then store the support matrix.

The steps, in order: choose the rows, tools and faults (:mod:`cutbench.harness.matrix.generator`);
run the matrix scenario as one run (the probes' ground truth recorded first, the rows that need the
GPU to themselves last and alone); judge each trial into a cell
(:mod:`cutbench.harness.matrix.checker`); store ``matrix.parquet`` and ``matrix.md`` in the run
directory and redraw its report with the matrix section. :func:`from_runs` builds the matrix again
from stored runs of one machine, with no trial.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pandas as pd

from cutbench.errors import InvalidArgument
from cutbench.harness.matrix import checker as cells
from cutbench.harness.matrix import generator as plan
from cutbench.harness.nemesis import Backends
from cutbench.harness.reports import html as report
from cutbench.harness.matrix import reports as render
from cutbench.harness.runner.run import ProgressFn, RunOptions, RunOutcome, execute, variant_specs
from cutbench.harness.hunt.store import deviation_rows
from cutbench.harness.store.rundir import RunDir, read_matrix


def utility_version() -> str:
    """The version line NVIDIA's ``cuda-checkpoint`` prints in its ``--help`` (it is the driver's: the utility
    is a thin client of it), or its path when it prints none; "" when it is not on PATH."""
    exe = shutil.which("cuda-checkpoint")
    if exe is None:
        return ""
    try:
        p = subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{exe} ({type(exc).__name__})"
    found = re.search(r"[Vv]ersion[: ]+([\w.\-]+)", p.stdout + p.stderr)
    return found.group(1).rstrip(".") if found else f"present ({exe})"


def display_path(path: Path) -> str:
    """Return ``path`` as the matrix's replay commands name it: relative to the working directory when inside it
    (a committed reference run reads the same on every checkout), else absolute."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def run_matrix(probes: tuple[str, ...] = (), tools: tuple[str, ...] = (), faults: tuple[str, ...] = (),
               results_root: str | Path = "results", *, jobs: int | str = 1, progress: ProgressFn | None = None,
               workdir: str | Path | None = None, findings: list[Path] | None = None) -> tuple[RunOutcome, pd.DataFrame]:
    """Measure the matrix of ``probes`` (row or probe names; none: all) × ``tools`` × ``faults``; return the
    run and its matrix table, with the lifecycle deviations of the hunts under ``findings`` (see
    :func:`store_matrix`). Bad names raise :class:`InvalidArgument` before anything runs."""
    # Read before any trial: a folder with no hunt, or a damaged hunt.json, is named before anything runs.
    deviations = deviation_rows(findings) if findings else None
    chosen = plan.check_tools(tools)
    backends = Backends()
    # Asked for by name, a tool that cannot run here is a column of "not measured" with the reason; by
    # default only the tools this machine has are columns, and the others are named with why.
    absent = {} if tools else {t: why for t in chosen if (why := backends.unavailable_reason(t))}
    grid = plan.grid(plan.select_rows(probes), tuple(t for t in chosen if t not in absent), plan.check_faults(faults))
    grid["tools_unavailable"] = absent
    grid["cuda_checkpoint_version"] = utility_version()
    scen = plan.scenario(grid, jobs=jobs)
    specs, skipped = variant_specs([(v.variant, v) for v in scen.variants], backends)
    outcome = execute(scen, specs, results_root, RunOptions(skipped=skipped, progress=progress, workdir=workdir,
                                                            name="matrix", extra_meta={"matrix": grid}, backends=backends))
    return outcome, store_matrix(outcome.run, deviations=deviations)


def store_matrix(run: RunDir, table: pd.DataFrame | None = None,
                 deviations: list[dict[str, Any]] | None = None) -> pd.DataFrame:
    """Write ``matrix.parquet`` and ``matrix.md`` into ``run`` (``table``, or the matrix of ``run`` itself) and
    redraw its report with the matrix section; return the table.

    ``deviations`` (:func:`~cutbench.harness.hunt.store.deviation_rows` of the hunts asked for) become the
    run's ``deviations`` table, one row per lifecycle deviation per tool, shown after the grid; without them a
    table stored before is kept."""
    meta = {**run.meta(), "run_dir": display_path(run.path)}
    if table is None:
        try:
            table = cells.build(run.table("trials"), meta)
        except ValueError as exc:
            raise InvalidArgument(str(exc)) from None
    run.write_table("matrix", table)
    if deviations is not None:
        run.write_table("deviations", deviations)
    run.write_text("matrix.md", render.markdown(table, (meta.get("matrix") or {}).get("tools_unavailable") or {},
                                                run.table("deviations")))
    report.build(run)
    return table


def from_runs(paths: list[str | Path], into: str | Path | None = None,
              findings: list[Path] | None = None) -> tuple[RunDir, pd.DataFrame]:
    """The matrix of stored matrix runs of one machine, merged (a later run wins a point both measured),
    stored in ``into`` (default: the first run) with the deviations of the hunts under ``findings``. Raises :class:`InvalidArgument` for a run that is no matrix
    run or runs of different machines."""
    runs = [RunDir.open(p) for p in paths]
    tables = []
    for run in runs:
        try:
            tables.append(cells.build(run.table("trials"), {**run.meta(), "run_dir": display_path(run.path)}))
        except ValueError as exc:
            raise InvalidArgument(str(exc)) from None
    try:
        merged = cells.merge(tables)
    except ValueError as exc:
        raise InvalidArgument(str(exc)) from None
    target = RunDir.open(into) if into else runs[0]
    return target, store_matrix(target, merged, deviation_rows(findings) if findings else None)


def compare_matrices(a: str | Path, b: str | Path) -> tuple[pd.DataFrame, dict[str, Any], str]:
    """The cells that changed from matrix ``a`` to ``b``, the environment that differs, and both as Markdown."""
    table, env = cells.compare(read_matrix(a), read_matrix(b))
    return table, env, render.comparison(table, env, str(a), str(b))
