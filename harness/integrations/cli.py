"""The ``cutbench`` command line: options in, the rooms' functions called, their results shown.

It decides nothing about runs, verdicts or files itself. Exit codes are
``cutbench.errors``'s (README, "Commands and exit codes"): 0 all valid,
1 invalid found, 2 unknown only, 3 a replay that did not reproduce,
254 bad arguments or an unusable environment, 255 internal error, 128 + N
interrupted by signal N.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.text import Text

from cutbench.errors import (EXIT_BAD_ARGUMENTS, EXIT_CHECK_FAILED, EXIT_INTERNAL, EXIT_INTERRUPTED,
                             EXIT_NOT_REPRODUCED, EXIT_OK, EXIT_SIGNAL_BASE, CutbenchError, InvalidArgument,
                             Unavailable)

console = Console(stderr=True, soft_wrap=True)
# The signal that interrupted the run (SIGINT, SIGTERM or SIGHUP): the exit code is 128 + its number,
# as a shell reports a process a signal stopped (130, 143, 129).
_INTERRUPTED_BY = [0]


def interrupted_code() -> int:
    """Return the exit code of an interrupted command: 128 + the signal (130 for Ctrl-C)."""
    return EXIT_SIGNAL_BASE + _INTERRUPTED_BY[0] if _INTERRUPTED_BY[0] else EXIT_INTERRUPTED


def say(text: str, style: str | None = None) -> None:
    """Print ``text`` to the terminal as it is: never read as rich markup (user values and error
    messages contain square brackets: ``[plan]``, ``--set plan.source=[/x]``)."""
    console.print(text, style=style, markup=False, highlight=False)


def _fail(message: str, code: int = EXIT_BAD_ARGUMENTS) -> None:
    console.print(Text.assemble(("error: ", "bold red"), message), highlight=False)
    sys.exit(code)


@click.group()
@click.version_option(package_name="cutbench", message="cutbench %(version)s")
def cli() -> None:
    """cutbench: does a GPU checkpoint restore the application at one coherent instant?"""


def _progress_printer(as_json: bool):
    """A progress callback: a rich bar on a terminal, one line per trial otherwise."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    state: dict[str, Any] = {"invalid": 0, "progress": None, "task": None}

    def callback(result: Any, done: int, total: int) -> None:
        state["invalid"] += result.verdict.outcome == "invalid"
        if as_json:
            return
        if console.is_terminal:
            if state["progress"] is None:
                bar = state["progress"] = Progress(TextColumn("trials"), BarColumn(), MofNCompleteColumn(),
                                                   TextColumn("invalid trials {task.fields[invalid]}"), TextColumn("ETA"),
                                                   TimeRemainingColumn(), console=console, transient=True)
                bar.start()
                state["task"] = bar.add_task("run", total=total, invalid=0)
            state["progress"].update(state["task"], completed=done, invalid=state["invalid"])
            if done == total:
                state["progress"].stop()
        else:
            say(f"[{done}/{total}] {result.spec.trial_id} {result.spec.backend}/{result.spec.receiver_mode} "
                f"{result.spec.cut_plan().describe()} -> {result.verdict.outcome} "
                f"({len(result.verdict.findings)} findings) {result.record.error[:120]}")

    def stop() -> None:
        if state["progress"] is not None:
            state["progress"].stop()

    callback.stop = stop  # type: ignore[attr-defined]
    return callback


def _report_run(outcome: Any, as_json: bool) -> int:
    """Show a finished (or interrupted) run; return the command's exit code."""
    from cutbench.harness.reports.summary import figures, run_verdict

    for line in outcome.run.meta().get("swept", []):  # what killed runs had left, removed before this one
        say(f"removed, left by a run whose harness is gone: {line}", "yellow")
    code = outcome.command_exit_code(interrupted_code())
    report_html = outcome.run.path / "report.html"
    if as_json:
        click.echo(json.dumps({"run_dir": str(outcome.run.path), "complete": outcome.complete,
                               "outcomes": outcome.outcome_counts(), "exit_code": code,
                               "skipped_arms": outcome.skipped_arms,
                               "report": str(report_html) if report_html.exists() else None,
                               **figures(outcome.trials)}))
    else:
        text = (outcome.run.path / "summary.md").read_text()
        if console.is_terminal:  # tables and the verdict rendered; piped output stays plain Markdown
            from rich.markdown import Markdown

            console.print(Markdown(text))
        else:
            console.print(text, highlight=False, markup=False)
        # The result itself goes to stdout, so that it can be piped (`| tail -3`); everything above is stderr.
        click.echo(f"verdict: {run_verdict(outcome.trials, outcome.run.meta()).text} (exit {code})")
        click.echo(f"results: {outcome.run.path}" + ("" if outcome.complete else "  (partial)"))
        if report_html.exists():
            click.echo(f"report: {report_html}")
    return code


def _execution_options(command: Any) -> Any:
    """The options that say what runs a run's trials: ``--jobs``, ``--executor``, ``--ray-address``."""
    for option in reversed([
        click.option("--jobs", "jobs", default=None, metavar="N|auto",
                     help="Trials run at once (the scenario's run.jobs; default 1): N, or auto for one per CPU "
                          "(run.trials_per_gpu per GPU on a GPU host). Verdicts are those of a serial run."),
        click.option("--executor", "executor", type=click.Choice(["threads", "ray"]), default=None,
                     help="What runs the trials (the scenario's run.executor; default threads): worker threads here, "
                          "or Ray tasks (pip install 'cutbench[ray]'; --jobs then defaults to auto)."),
        click.option("--ray-address", "ray_address", default=None, metavar="HOST:PORT|auto",
                     help="With --executor ray: the Ray cluster to connect to (run.ray_address); default: start a "
                          "local Ray."),
    ]):
        command = option(command)
    return command


def _execution_overrides(executor: str | None, ray_address: str | None) -> tuple[str, ...]:
    """``--executor`` and ``--ray-address`` as ``--set`` overrides, which come after --set's own (the options win)
    so that the scenario's validation checks them with the rest."""
    from cutbench.harness.model.scenario import toml_value

    return tuple(f"run.{key}={toml_value(value)}" for key, value in
                 (("executor", executor), ("ray_address", ray_address)) if value is not None)


@cli.command()
@click.argument("scenario", type=click.Path(dir_okay=False), required=False)
@click.option("--out", "out", default="results", show_default=True, help="Results root directory.")
@click.option("--set", "overrides", multiple=True, metavar="SECTION.KEY=VALUE", help="Override a scenario field.")
@click.option("--json", "as_json", is_flag=True, help="Print a machine-readable result.")
@click.option("--variant", "variants", multiple=True, metavar="NAME",
              help="Run only this [[variants]] entry of the scenario (repeatable); default: every variant.")
@click.option("--resume", "resume", default=None, type=click.Path(file_okay=False), metavar="RUN_DIR",
              help="Continue the interrupted run RUN_DIR (its own scenario, plan and seeds; its finished trials kept). "
                   "With SCENARIO (and --set), that scenario must be the run's.")
@_execution_options
def run(scenario: str | None, out: str, overrides: tuple[str, ...], as_json: bool, jobs: str | None,
        variants: tuple[str, ...], executor: str | None, ray_address: str | None, resume: str | None) -> None:
    """Run every trial of SCENARIO and store the results under --out (or continue a run: --resume RUN_DIR)."""
    from dataclasses import replace

    from cutbench.harness.runner.run import run_scenario
    from cutbench.harness.runner.resume import resume_run
    from cutbench.harness.model.scenario import load_scenario, parse_jobs, select_variants

    if scenario is None and resume is None:
        raise click.UsageError("give a SCENARIO to run, or --resume RUN_DIR to continue a run")
    if resume is not None and variants:
        raise click.UsageError("--variant with --resume: a resumed run continues every variant it planned")
    overrides += _execution_overrides(executor, ray_address)
    scen = select_variants(load_scenario(scenario, list(overrides)), variants) if scenario is not None else None
    if jobs is not None and scen is not None:  # wins over run.jobs in the file and in --set, like --set over the file
        scen = replace(scen, jobs=parse_jobs("--jobs", jobs))
    progress = _progress_printer(as_json)
    try:
        if resume is not None:
            outcome = resume_run(resume, scenario=scen, progress=progress,
                                 jobs=parse_jobs("--jobs", jobs) if jobs is not None else None)
        else:
            assert scen is not None  # checked above: no --resume means a SCENARIO
            outcome = run_scenario(scen, out, progress=progress)
    finally:
        progress.stop()
    sys.exit(_report_run(outcome, as_json))


@cli.command()
@click.argument("trial_file", type=click.Path(dir_okay=False))
@click.option("--out", "out", default="results", show_default=True)
@click.option("--json", "as_json", is_flag=True)
def replay(trial_file: str, out: str, as_json: bool) -> None:
    """Rerun exactly the trial stored in TRIAL_FILE and say whether its verdict reproduced.

    Reproduced means the same outcome and the same kinds of finding (counts
    may differ where timing decides them). Exits 0 when the verdict
    reproduced and 3 when it did not; the replay is a run of its own under
    --out (``results/latest`` keeps pointing at the run you were reading).
    """
    from cutbench.harness.runner.replay import replay as replay_trial

    result = replay_trial(trial_file, out)
    if result.replayed is None:
        _fail("replay was interrupted", interrupted_code())
    if as_json:
        click.echo(json.dumps(result.to_dict()))
    else:
        d = result.to_dict()
        console.print(Text.assemble(f"stored {d['stored']} {d['stored_findings']}, replayed {d['replayed']} {d['replayed_findings']}: ",
                                    ("verdict reproduced", "green") if result.reproduced else ("verdict differs", "red")),
                      highlight=False)
        say(f"replay run: {result.run.path}")
    sys.exit(EXIT_OK if result.reproduced else EXIT_NOT_REPRODUCED)


@cli.command()
@click.argument("run_dir", type=click.Path(file_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print what was packed as JSON.")
def pack(run_dir: str, as_json: bool) -> None:
    """Pack RUN_DIR's per-trial records (trials/, references/) into one trials.tar.xz, in place.

    replay, analyze, report and cutbench.open_run read a packed run as before.
    A damaged run is refused (the file named, nothing changed); packing a
    packed run changes nothing.
    """
    from cutbench.harness.store.pack import pack as pack_run

    result = pack_run(run_dir)
    if as_json:
        click.echo(json.dumps(result.to_dict()))
    else:
        say(result.text())


@cli.command()
@click.argument("run_dir", type=click.Path(file_okay=False))
@click.option("--json", "as_json", is_flag=True)
def analyze(run_dir: str, as_json: bool) -> None:
    """Recompute every verdict of RUN_DIR from stored data; exit 1 if any differs."""
    from cutbench.harness.store.analysis import reanalyze
    from cutbench.harness.store.rundir import RunDir

    result = reanalyze(RunDir.open(run_dir))
    diffs = result.differences
    if as_json:
        click.echo(json.dumps({"trials": len(result.rows), "differences": diffs}))
    else:
        say(f"{len(result.rows)} trials re-analysed, {len(diffs)} verdicts differ")
        for d in diffs:
            say(f"  {d['trial_id']}: stored {d['stored']}, recomputed {d['recomputed']}")
    sys.exit(EXIT_CHECK_FAILED if diffs else EXIT_OK)


@cli.command()
@click.argument("scenario", type=click.Path(dir_okay=False))
@click.option("--axis", "axes", multiple=True, metavar="FIELD=V1,V2",
              help="A sweep axis (repeatable): any scenario field and its values, e.g. workload.params.state_size=4096,65536 "
                   "or 'plan.ops=[[2,2],[3,3]]'. The run covers their cartesian product.")
@click.option("--out", "out", default="results", show_default=True, help="Results root directory.")
@click.option("--set", "overrides", multiple=True, metavar="SECTION.KEY=VALUE", help="Override a scenario field at every point.")
@click.option("--dry-run", is_flag=True, help="List the sweep points and their trial counts; run nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print a machine-readable result.")
@_execution_options
def sweep(scenario: str, axes: tuple[str, ...], out: str, overrides: tuple[str, ...], dry_run: bool, as_json: bool,
          jobs: str | None, executor: str | None, ray_address: str | None) -> None:
    """Run SCENARIO at every point of the cartesian product of --axis values (and of its own arms), in one run."""
    from cutbench.harness.generator import sweep as sw
    from cutbench.harness.model.scenario import parse_jobs, toml_value
    from cutbench.harness.runner.run import run_sweep

    overrides += _execution_overrides(executor, ray_address)
    if jobs is not None:  # checked as --jobs here; the whole sweep is one run, so it holds at every point
        overrides += (f"run.jobs={toml_value(parse_jobs('--jobs', jobs))}",)
    parsed = [sw.parse_axis(a) for a in axes]
    if dry_run:
        points = sw.plan_points(scenario, parsed, list(overrides))
        if as_json:
            click.echo(json.dumps({"points": points, "trials": sum(p["trials"] for p in points)}))
        else:
            for p in points:
                click.echo(f"{p['variant']}\t{p['arms']} arms\t{p['trials']} trials")
            click.echo(f"total\t{sum(p['trials'] for p in points)} trials")
        sys.exit(EXIT_OK)
    progress = _progress_printer(as_json)
    try:
        outcome = run_sweep(scenario, parsed, out, overrides=list(overrides), progress=progress)
    finally:
        progress.stop()
    sys.exit(_report_run(outcome, as_json))


@cli.command()
@click.argument("run_dir", type=click.Path(file_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print the written paths and the verdict as JSON.")
def report(run_dir: str, as_json: bool) -> None:
    """Regenerate summary.md, plots/*.png and report.html of RUN_DIR from its stored data."""
    from cutbench.harness.reports import html as rep
    from cutbench.harness.store.rundir import RunDir
    from cutbench.harness.reports.summary import figures, run_verdict

    run = RunDir.open(run_dir)
    files = rep.build(run)
    trials = run.table("trials")
    v = run_verdict(trials, run.meta())
    if as_json:
        click.echo(json.dumps({**files.to_dict(), "run_dir": str(run.path), "verdict": v.label, "counts": v.counts,
                               **figures(trials)}))
    else:
        click.echo(f"verdict: {v.text}")
        click.echo(f"report: {files.report}")
        click.echo(f"summary: {files.summary}; plots in {files.report.parent / 'plots'}")


@cli.command()
@click.argument("run_a", type=click.Path(file_okay=False))
@click.argument("run_b", type=click.Path(file_okay=False))
@click.option("--fail-on-regression", is_flag=True, help="Exit 1 when a plan valid in RUN_A is invalid in RUN_B.")
@click.option("--json", "as_json", is_flag=True, help="Print the comparison as JSON.")
def compare(run_a: str, run_b: str, fail_on_regression: bool, as_json: bool) -> None:
    """Put RUN_B beside RUN_A on the plans both ran: rates, stage timings, plans whose outcome changed."""
    from cutbench.harness.reports import compare as cmp
    from cutbench.harness.store.rundir import RunDir
    from cutbench.harness.reports.summary import replay_command

    a, b = RunDir.open(run_a), RunDir.open(run_b)
    result = cmp.compare(a.table("trials"), b.table("trials"), f"{a.run_id} ({a.path})", f"{b.run_id} ({b.path})")
    regressions = result.regressions
    if as_json:
        data = result.to_dict()
        data["replay_regressions"] = [replay_command(b.path, t) for t in regressions["trial_b"]]
        click.echo(json.dumps(data))
    else:
        click.echo(cmp.render(result))
        for t in regressions["trial_b"]:
            click.echo(f"regressed: {replay_command(b.path, t)}")
    sys.exit(EXIT_CHECK_FAILED if fail_on_regression and len(regressions) else EXIT_OK)


@cli.command()
@click.argument("runs", nargs=-1, required=True, type=click.Path(file_okay=False))
@click.option("--into", "into", default=None, type=click.Path(file_okay=False),
              help="Run directory that stores criteria.parquet and gets the report section (default: the first RUN).")
@click.option("--json", "as_json", is_flag=True, help="Print the table as JSON records.")
def criteria(runs: tuple[str, ...], into: str | None, as_json: bool) -> None:
    """The six criteria per backend (consistency, transparency, coverage, speed, correctness, overhead) from RUNS.

    Stores criteria.parquet in the first run (or --into) and regenerates its
    report.html, which then has a criteria section with its plots.
    """
    from cutbench.harness.reports import criteria as crit
    from cutbench.harness.reports import html as rep
    from cutbench.harness.store.rundir import RunDir

    opened = [RunDir.open(r) for r in runs]
    table = crit.criteria([crit.StoredRun(r.table("trials"), r.table("timeline"), r.meta(), r.table("effects")) for r in opened])
    target = RunDir.open(into) if into else opened[0]
    path = target.write_table("criteria", table)
    files = rep.build(target)
    if as_json:
        click.echo(json.dumps({"criteria": str(path), "report": str(files.report),
                               "rows": json.loads(table.to_json(orient="records"))}))
        return
    shown = crit.display(table)
    click.echo(shown.drop(columns=["method"]).to_markdown(index=False))
    say(f"criteria: {path}; report: {files.report} (how each row was measured: the method column there)")


@cli.command()
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
    from cutbench.harness.generator import matrix as plan
    from cutbench.harness.reports import matrix as render
    from cutbench.harness.runner import matrix as runner

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

        progress = _progress_printer(as_json)
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


@cli.command()
@click.option("--tool", required=True, metavar="TOOL",
              help="cuda (the driver API), cuda-checkpoint (NVIDIA's utility), criu-cuda-plugin, or criu (a CPU probe).")
@click.option("--budget", "budget_s", type=float, default=300.0, show_default=True, metavar="S",
              help="Seconds of directed search (a shrink in progress may run up to half as long again).")
@click.option("--random-walk", "walk_s", type=float, default=0.0, metavar="S",
              help="Also run S seconds of random walk over the same steps, to measure the search against it.")
@click.option("--length", type=int, default=10, show_default=True, help="Steps per sequence.")
@click.option("--repeat", type=int, default=3, show_default=True,
              help="Runs of each reproducer on its own (0: write them, run none).")
@click.option("--bound", "bound_s", type=float, default=60.0, show_default=True, metavar="S",
              help="The longest any one step may take; past it the step is a hang (a finding).")
@click.option("--sequences", type=int, default=None, metavar="N",
              help="Also stop once N sequences ran, shrinking's included (an effort budget, the same on any host).")
@click.option("--seed", type=int, default=None, help="Draw the same sequences on every run (a repeatable search).")
@click.option("--model", "overrides", multiple=True, metavar="ACTION@STATE=ok|refused",
              help="State a promise in place of the documented one (repeatable), e.g. criu_restore@running=ok.")
@click.option("--out", default="results/hunt", show_default=True, type=click.Path(file_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print hunt.json's summary as JSON.")
def hunt(tool: str, budget_s: float, walk_s: float, length: int, repeat: int, bound_s: float, sequences: int | None,
         seed: int | None, overrides: tuple[str, ...], out: str, as_json: bool) -> None:
    """Search a tool's lifecycle for deviations from its documentation; shrink each to a standalone reproducer.

    Writes OUT/TOOL/hunt.json, FINDINGS.md and repro/*.py. Exits 1 when a deviation was found, 0 when none.
    """
    from cutbench.harness.runner import hunt as runner

    stated = {}
    for item in overrides:
        key, _, value = item.partition("=")
        if "@" not in key or value not in ("ok", "refused"):
            raise InvalidArgument(f"--model {item!r}: write ACTION@STATE=ok or ACTION@STATE=refused, "
                                  "e.g. criu_restore@running=ok")
        stated[key] = value
    doc = runner.hunt(tool, Path(out) / tool, budget_s=budget_s, walk_s=walk_s, length=length, repeat=repeat,
                      bound_s=bound_s, overrides=stated, sequences=sequences, seed=seed,
                      command="cutbench hunt " + " ".join(sys.argv[2:]),
                      say=(lambda _m: None) if as_json else say)
    if as_json:
        click.echo(json.dumps({"out": str(Path(out) / tool), "search": doc["search"], "walk": doc["walk"],
                               "findings": [{"id": f["id"], "summary": f["deviation"]["summary"],
                                             "shown": sum(r["shown"] for r in f["standalone"]),
                                             "public_report": f["public_report"]} for f in doc["findings"]]}))
    sys.exit(EXIT_CHECK_FAILED if doc["findings"] else EXIT_OK)


@cli.command()
@click.option("--json", "as_json", is_flag=True)
def doctor(as_json: bool) -> None:
    """Check CRIU, privileges, GPU, driver and packages; say how to fix what is missing."""
    from cutbench.harness.environment import doctor as doc

    checks = doc.run_checks()
    if as_json:
        click.echo(json.dumps([c.__dict__ for c in checks], indent=2))
    else:
        click.echo(doc.format_checks(checks))
    sys.exit(EXIT_CHECK_FAILED if doc.problems(checks) else EXIT_OK)


@cli.group()
def criu() -> None:
    """Provision and inspect CRIU."""


@criu.command("install")
@click.option("--prefix", type=click.Path(file_okay=False), default=None, help="Install prefix (default: .criu/ in the checkout).")
@click.option("--download-only", type=click.Path(file_okay=False), default=None, help="Only download the .debs into DIR.")
@click.option("--from", "from_dir", type=click.Path(file_okay=False, exists=True), default=None, help="Install from .debs in DIR (no network).")
@click.option("--suite", default="unstable", show_default=True, help="Debian suite carrying CRIU >= 4.2.")
@click.option("--force", is_flag=True, help="Reinstall even if a working CRIU (and, with --with-cuda-plugin, its plugin) is present.")
@click.option("--mirror", default=None, help="Debian mirror URL (default: read from this machine's apt configuration).")
@click.option("--with-cuda-plugin", is_flag=True,
              help="Also build CRIU's CUDA plugin (cuda_plugin.so) from the same CRIU release's source into PREFIX/lib/criu "
                   "(needs gcc, make, libc6-dev); with --download-only also fetch that source, with --from build from it.")
@click.option("--json", "as_json", is_flag=True, help="Print the CRIU found or installed as JSON.")
def criu_install(prefix: str | None, download_only: str | None, from_dir: str | None, suite: str, force: bool, mirror: str | None,
                 with_cuda_plugin: bool, as_json: bool) -> None:
    """Use a working CRIU >= 4.2 on PATH, or fetch Debian's package into a local prefix."""
    import os

    from cutbench.harness.environment.criu.install import install
    from cutbench.harness.environment.criu.plugin import PLUGIN, PLUGIN_ENV, installed_plugin_dir

    prefix_path = Path(prefix) if prefix else None
    result = install(prefix_path, download_only=Path(download_only) if download_only else None,
                     from_dir=Path(from_dir) if from_dir else None, suite=suite, force=force, mirror=mirror,
                     with_cuda_plugin=with_cuda_plugin)
    plugin = installed_plugin_dir(prefix_path) / PLUGIN if with_cuda_plugin and result else None
    if as_json:
        click.echo(json.dumps({"downloaded_to": download_only} if result is None else
                              {"version": result.version, "source": result.source, "argv": list(result.argv),
                               **({"cuda_plugin": str(plugin)} if plugin else {})}))
        return
    if result is None:
        say(f"downloaded CRIU packages{', its source and build .debs (for the CUDA plugin)' if with_cuda_plugin else ''} into {download_only}")
        return
    say(f"CRIU {result.version} ready ({result.source}): {' '.join(result.argv)}")
    if plugin:
        say(f"CRIU CUDA plugin ready: {plugin}")
        env = os.environ.get(PLUGIN_ENV)
        if env and Path(env) != plugin.parent:
            say(f"note: {PLUGIN_ENV}={env} is set and wins over it; unset it to use this plugin")


@cli.group()
def receiver() -> None:
    """The transactional receiver service."""


# The command is the one `python -m cutbench.receivers serve` runs, options and checks included:
# defined once in receivers/command.py (which imports the service only when it runs).
from cutbench.receivers.command import serve_command  # noqa: E402

receiver.add_command(serve_command)


@cli.group()
def engine() -> None:
    """The container engines of the docker and podman backends."""


@engine.command("start")
@click.argument("name", type=click.Choice(["docker"]))
def engine_start(name: str) -> None:
    """Start the project's own dockerd (experimental on, the project's CRIU on its PATH) unless it answers."""
    from cutbench.harness.environment import engines

    started = engines.start_docker()
    say(("started: " if started else "already running: ") + engines.engine_status(name))


@engine.command("stop")
@click.argument("name", type=click.Choice(["docker"]))
def engine_stop(name: str) -> None:
    """Stop the project's own dockerd and remove the trial containers it still holds."""
    from cutbench.harness.environment import engines

    say("stopped" if engines.stop_docker() else f"no dockerd of the project was running ({engines.docker_paths().root})")


@engine.command("status")
def engine_status() -> None:
    """One line per engine (where it is, whether it can checkpoint), then one per trial container left in either."""
    from cutbench.harness.environment import engines, leftovers

    for name in engines.ENGINES:
        say(engines.engine_status(name))
    for line in leftovers.status_lines():  # trial containers still there (the next run removes a dead run's)
        say(line)


@cli.command("list")
@click.argument("what", type=click.Choice(["workloads", "backends", "scenarios"]))
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list of objects.")
def list_(what: str, as_json: bool) -> None:
    """List known workloads, backends (with availability) or scenario files."""
    from cutbench.harness.runner import catalog

    items: list[dict[str, Any]]
    if what == "workloads":
        items = catalog.workloads()
        lines = [f"{i['name']}\t{'GPU' if i['needs_gpu'] else 'CPU or GPU'} ({', '.join(i['arrays'])})\t"
                 f"{i['description']}\t{i['target']}" for i in items]
    elif what == "backends":
        items = catalog.backends()
        lines = [f"{i['name']}\t{'available' if i['available'] else 'unavailable: ' + i['reason']}" for i in items]
    else:
        items = catalog.scenario_files()
        lines = [i["path"] for i in items] or ["no scenario files under ./scenarios; the examples are in the cutbench "
                                               "source repository's scenarios/ (scenarios/README.md documents the format)"]
    click.echo(json.dumps(items) if as_json else "\n".join(lines))


def _interrupt_once() -> None:
    """Let the first Ctrl-C, SIGTERM or SIGHUP interrupt (KeyboardInterrupt) and ignore the next ones.

    The first one stops the run after the trial in flight is cleaned up and
    stores the partial run; a second one landing inside that cleanup would
    otherwise leave a workload, the receiver or an image directory behind.
    SIGTERM and SIGHUP are what CI runners, schedulers and ``timeout`` send
    on cancel: they get the same cleanup as Ctrl-C, and the exit code says
    which signal it was (143, 129).
    """
    import signal

    def handler(signum: int, frame: Any) -> None:
        if not _INTERRUPTED_BY[0]:
            _INTERRUPTED_BY[0] = signum
            raise KeyboardInterrupt
        say("interrupted: cleaning up and saving the partial run, please wait", "yellow")

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, handler)


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point: runs the CLI and maps errors to DESIGN.md's exit codes."""
    _interrupt_once()
    try:
        # standalone_mode=False: click's usage errors would exit 2, which
        # DESIGN.md reserves for "unknown only"; bad arguments exit 254.
        rv = cli.main(args=argv, prog_name="cutbench", standalone_mode=False)
    except click.exceptions.Abort:
        _fail("interrupted", interrupted_code())
    except click.ClickException as exc:
        exc.show()
        sys.exit(EXIT_BAD_ARGUMENTS)
    except (InvalidArgument, Unavailable) as exc:
        _fail(str(exc))
    except CutbenchError as exc:
        _fail(str(exc), EXIT_INTERNAL)
    except KeyboardInterrupt:
        _fail("interrupted", interrupted_code())
    except OSError as exc:
        from cutbench import storage

        if not storage.is_full_error(exc):
            _internal(exc)
        where = exc.filename or "a file"
        _fail(f"{where}: {exc.strerror}; free space there and run the command again")
    except Exception as exc:
        _internal(exc)
    sys.exit(rv if isinstance(rv, int) else EXIT_OK)


def _internal(exc: BaseException) -> None:
    """An internal error: the traceback, kept for bug reports, then exit 255."""
    import traceback

    traceback.print_exception(exc)
    _fail(f"internal error: {type(exc).__name__}: {exc}", EXIT_INTERNAL)


if __name__ == "__main__":
    main()
