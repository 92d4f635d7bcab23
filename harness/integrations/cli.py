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
from rich.text import Text

from cutbench import interrupts
from cutbench.harness.hunt.integrations import hunt
from cutbench.harness.matrix.integrations import matrix
from cutbench.harness.integrations.console import INTERRUPTED_BY, console, fail, interrupted_code, progress_printer, say
from cutbench.errors import (EXIT_BAD_ARGUMENTS, EXIT_CHECK_FAILED, EXIT_INTERNAL, EXIT_NOT_REPRODUCED, EXIT_OK, CutbenchError, InvalidArgument,
                             Unavailable)

@click.group()
@click.version_option(package_name="cutbench", message="cutbench %(version)s")
def cli() -> None:
    """cutbench: does a GPU checkpoint restore the application at one coherent instant?"""


cli.add_command(matrix)
cli.add_command(hunt)


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
        click.option("--executor", "executor", type=click.Choice(["threads", "ray", "slurm"]), default=None,
                     help="What runs the trials (the scenario's run.executor; default threads): worker threads here, "
                          "Ray tasks (pip install 'cutbench[ray]'; --jobs then defaults to auto), or a Slurm job "
                          "array (docs/slurm.md)."),
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
    progress = progress_printer(as_json)
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
        fail("replay was interrupted", interrupted_code())
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
    progress = progress_printer(as_json)
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

    from cutbench.harness.provision.criu.install import install
    from cutbench.harness.provision.criu.plugin import PLUGIN, PLUGIN_ENV, installed_plugin_dir

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
    from cutbench.harness.provision import engines

    started = engines.start_docker()
    say(("started: " if started else "already running: ") + engines.engine_status(name))


@engine.command("stop")
@click.argument("name", type=click.Choice(["docker"]))
def engine_stop(name: str) -> None:
    """Stop the project's own dockerd and remove the trial containers it still holds."""
    from cutbench.harness.provision import engines

    say("stopped" if engines.stop_docker() else f"no dockerd of the project was running ({engines.docker_paths().root})")


@engine.command("status")
def engine_status() -> None:
    """One line per engine (where it is, whether it can checkpoint), then one per trial container left in either."""
    from cutbench.harness.environment import leftovers
    from cutbench.harness.provision import engines

    for name in engines.ENGINES:
        say(engines.engine_status(name))
    for line in leftovers.status_lines():  # trial containers still there (the next run removes a dead run's)
        say(line)


@cli.group()
def slurm() -> None:
    """The Slurm cluster of the slurm backend: a local one of the project's own, or yours (SLURM_CONF)."""


@slurm.command("up")
def slurm_up() -> None:
    """Start a local Slurm of one node (munged, slurmctld, slurmd; partitions low and high) unless it answers."""
    from cutbench.harness.provision import slurm as cluster

    started = cluster.start()
    say(("started: " if started else "already running: ") + cluster.status())
    say(f"its clients: export SLURM_CONF={cluster.slurm_paths().conf}")


@slurm.command("down")
def slurm_down() -> None:
    """Cancel the local Slurm's jobs and stop its daemons."""
    from cutbench.harness.provision import slurm as cluster

    say("stopped" if cluster.stop() else f"no Slurm of the project was running ({cluster.slurm_paths().root})")


@slurm.command("install")
@click.option("--prefix", type=click.Path(file_okay=False), default=None,
              help="Install prefix (default: .slurm/ in the checkout; $CUTBENCH_SLURM_PREFIX).")
@click.option("--download-only", type=click.Path(file_okay=False), default=None, help="Only download the .debs into DIR.")
@click.option("--from", "from_dir", type=click.Path(file_okay=False, exists=True), default=None,
              help="Install from the .debs in DIR (no network).")
@click.option("--suite", default="bookworm", show_default=True, help="The Debian suite whose Slurm is carried.")
@click.option("--force", is_flag=True, help="Reinstall even if a bundled Slurm is there.")
@click.option("--mirror", default=None, help="Debian mirror URL (default: read from this machine's apt configuration).")
def slurm_install(prefix: str | None, download_only: str | None, from_dir: str | None, suite: str, force: bool,
                  mirror: str | None) -> None:
    """Carry Debian's Slurm and munge to a machine without them: unpacked into a prefix, run through their own
    loader; `slurm up` then starts the local cluster from it."""
    from cutbench.harness.provision import slurm_bundle

    bundle = slurm_bundle.install(Path(prefix) if prefix else None, suite=suite, force=force, mirror=mirror,
                                  download_only=Path(download_only) if download_only else None,
                                  from_dir=Path(from_dir) if from_dir else None)
    if bundle is None:
        say(f"downloaded Slurm's packages ({', '.join(slurm_bundle.PACKAGES)} and what they need) into {download_only}")
        return
    say(f"Slurm {bundle.version} ready under {bundle.prefix} (its programs in {bundle.bin_dir}); "
        f"`cutbench slurm up` starts the local cluster from it")


@slurm.command("status")
def slurm_status() -> None:
    """Which cluster the slurm backend reaches, whether it answers, its partitions."""
    from cutbench.harness.provision import slurm as cluster

    say(cluster.status())


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

    # The first is held while the main thread cleans up a trial (cutbench.interrupts).
    handler = interrupts.first_raises(first=lambda signum: INTERRUPTED_BY.__setitem__(0, signum),
                                      again=lambda _signum: say(interrupts.CLEANING_UP, "yellow"))
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
        fail("interrupted", interrupted_code())
    except click.ClickException as exc:
        exc.show()
        sys.exit(EXIT_BAD_ARGUMENTS)
    except (InvalidArgument, Unavailable) as exc:
        fail(str(exc))
    except CutbenchError as exc:
        fail(str(exc), EXIT_INTERNAL)
    except KeyboardInterrupt:
        fail("interrupted", interrupted_code())
    except OSError as exc:
        from cutbench import storage

        if not storage.is_full_error(exc):
            _internal(exc)
        where = exc.filename or "a file"
        fail(f"{where}: {exc.strerror}; free space there and run the command again")
    except Exception as exc:
        _internal(exc)
    sys.exit(rv if isinstance(rv, int) else EXIT_OK)


def _internal(exc: BaseException) -> None:
    """An internal error: the traceback, kept for bug reports, then exit 255."""
    import traceback

    traceback.print_exception(exc)
    fail(f"internal error: {type(exc).__name__}: {exc}", EXIT_INTERNAL)


if __name__ == "__main__":
    main()
