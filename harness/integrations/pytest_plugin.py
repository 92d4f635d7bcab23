"""pytest plugin (entry point ``pytest11``): cutbench as a CI gate.

Three ways in, each one test item per arm of a scenario:

* command line only — ``pytest --cutbench-scenario scenarios/gate.toml``
  adds one gate item per arm (when no collected test uses ``cutbench_run``);
* a marked test — ``@pytest.mark.cutbench(scenario="scenarios/*.toml")`` on
  ``def test_gate(cutbench_run): cutbench_run.check()``;
* one trial — ``cutbench_trial("3/publish", fault="leave_running")`` returns
  its verdict.

Options: ``--cutbench-scenario`` (repeatable, globs allowed),
``--cutbench-backend`` (repeatable, replaces the scenarios' backends),
``--cutbench-max-invalid-rate`` (default 0), ``--cutbench-out`` (results
root; default a directory under pytest's base temp), ``--cutbench-jobs``
(trials of an arm run at once: N or auto, like ``cutbench run --jobs``;
default the scenario's ``run.jobs``). Gate figures go to
JUnit XML as ``<property>`` elements; a failing gate prints each failing
trial's ``cutbench replay`` command.

The plugin is loaded by every pytest run where cutbench is installed, so it
imports nothing beyond pytest at load time and does nothing unless one of
its options, its marker or its fixtures is used.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cutbench.errors import GateFailed

MARKER = "cutbench"
_RUN_FIXTURE = "cutbench_run"
# Set when a test's ``cutbench_run`` takes its scenarios from ``--cutbench-scenario`` (it has no marker scenario):
# the command line's scenarios then parametrize that test instead of adding gate items of their own.
_CLI_PARAMETRIZED = pytest.StashKey[bool]()
# Ground truth the session's arms recorded, by reference key: each program's two uninterrupted runs once a session.
_REFERENCES = pytest.StashKey[dict]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("cutbench", "cutbench checkpoint/restore correctness gate")
    group.addoption("--cutbench-scenario", action="append", default=[], metavar="PATH",
                    help="Scenario file or glob to gate on (repeatable): one test item per arm.")
    group.addoption("--cutbench-backend", action="append", default=[], metavar="NAME",
                    help="Run the scenarios with this backend instead of theirs (repeatable).")
    group.addoption("--cutbench-max-invalid-rate", type=float, default=None, metavar="FRACTION",
                    help="Largest invalid recovery rate that passes, 0..1 (default 0, or the marker's).")
    group.addoption("--cutbench-out", default=None, metavar="DIR",
                    help="Results root for gate runs (default: a 'cutbench' directory under pytest's base temp).")
    group.addoption("--cutbench-jobs", type=_jobs_option, default=None, metavar="N|auto",
                    help="Trials of a gate arm run at once (replaces the scenarios' run.jobs): N, or auto for one per "
                         "CPU (run.trials_per_gpu per GPU on a GPU host). Verdicts are those of a serial run.")
    group.addoption("--cutbench-allow-skip", action="store_true", default=False,
                    help="Skip (instead of fail) a gate arm or trial that cannot run here (no CRIU, no GPU, ...). "
                         "Without it a gate that tested nothing fails.")


def _jobs_option(text: str) -> int | str:
    """``--cutbench-jobs`` checked as ``run.jobs`` is (cutbench is imported only when the option is given)."""
    import argparse

    from cutbench.errors import InvalidArgument
    from cutbench.harness.model.scenario import parse_jobs

    try:
        return parse_jobs("--cutbench-jobs", text)
    except InvalidArgument as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(scenario=None, backend=None, max_invalid_rate=None, set=()): gate a test using the "
        f"{_RUN_FIXTURE} fixture on scenario files (paths or globs; one test per arm).",
    )


# -- shared helpers (imports of cutbench happen only here, on use) -------------


def _results_root(config: pytest.Config) -> Path:
    out = config.getoption("--cutbench-out")
    if out:
        return Path(out)
    factory = getattr(config, "_tmp_path_factory", None)  # pytest's own basetemp; absent with -p no:tmpdir
    if factory is None:
        import tempfile

        return Path(tempfile.mkdtemp(prefix="cutbench-"))
    return Path(factory.getbasetemp()) / "cutbench"


def _max_rate(config: pytest.Config, marker: Any = None) -> float:
    option = config.getoption("--cutbench-max-invalid-rate")
    if option is not None:
        return float(option)
    if marker is not None and marker.kwargs.get("max_invalid_rate") is not None:
        return float(marker.kwargs["max_invalid_rate"])
    return 0.0


def _as_list(value: Any) -> list[str]:
    if value is None:
        return []
    return [value] if isinstance(value, str) else [str(v) for v in value]


def _arm_params(patterns: list[str], base: Path | None, backends: list[str], overrides: list[str]) -> list[tuple[Path, str, str]]:
    """``(scenario path, arm label, test id)`` for every arm of every matching scenario, each scenario checked as a
    run checks its input before any trial (:func:`cutbench.harness.integrations.gate.check`)."""
    from cutbench.harness.integrations import gate

    out = []
    for path in gate.find_scenarios(patterns, base):
        scenario = gate.load(path, backends, overrides)
        gate.check(scenario)
        for label, _sub, _arm in gate.gate_points(scenario):
            out.append((path, label, f"{scenario.name}:{label}"))
    return out


def _cannot_run(config: pytest.Config, reason: str) -> None:
    """An arm or trial that cannot run here fails the gate (it tested nothing) unless skipping is allowed."""
    if config.getoption("--cutbench-allow-skip"):
        pytest.skip(reason)
    pytest.fail(f"{reason}\n(a gate must not pass without testing; pass --cutbench-allow-skip to skip instead)", pytrace=False)


def _run_gate(config: pytest.Config, path: Path, arm_label: str, backends: list[str], overrides: list[str], max_rate: float) -> Any:
    from cutbench.harness.integrations import gate
    from cutbench.errors import Unavailable

    scenario, arm = gate.point_by_label(gate.load(path, backends, overrides), arm_label)
    jobs = config.getoption("--cutbench-jobs")
    if jobs is not None:
        from dataclasses import replace

        scenario = replace(scenario, jobs=jobs)
    try:
        outcome = gate.run_arm(scenario, arm, _results_root(config), config.stash.setdefault(_REFERENCES, {}))
    except Unavailable as exc:
        _cannot_run(config, f"cutbench: {arm_label} cannot run here: {exc}")
    if not outcome.complete:
        # The runner turned Ctrl-C into a stored partial run; pytest must still stop the session.
        raise KeyboardInterrupt
    return gate.evaluate(outcome, max_rate, f"{scenario.name} [{arm_label}]")


# -- command-line gate items ----------------------------------------------------


class GateItem(pytest.Item):
    """One arm of one scenario, gated (added by ``--cutbench-scenario``)."""

    def __init__(self, *, scenario_path: Path, arm_label: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.scenario_path = scenario_path
        self.arm_label = arm_label
        self.add_marker(MARKER)

    def runtest(self) -> None:
        config = self.config
        result = _run_gate(config, self.scenario_path, self.arm_label, config.getoption("--cutbench-backend"), [], _max_rate(config))
        self.user_properties.extend(result.properties())
        if not result.passed:
            raise GateFailed(result.message())

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> Any:
        if isinstance(excinfo.value, GateFailed):
            return str(excinfo.value)
        return super().repr_failure(excinfo)

    def reportinfo(self) -> tuple[Any, int | None, str]:
        return self.scenario_path, None, f"cutbench gate {self.name}"


@pytest.hookimpl(tryfirst=True)  # before -k / -m deselection, so they apply to gate items too
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    patterns = config.getoption("--cutbench-scenario")
    if not patterns or config.stash.get(_CLI_PARAMETRIZED, False):
        return  # none given, or they parametrize the user's own gate tests (which name no scenario) instead
    # Beside a marked test that names its own scenario, the command line's scenarios are gated too: both apply.
    from cutbench.errors import CutbenchError

    try:
        params = _arm_params(patterns, None, config.getoption("--cutbench-backend"), [])
    except CutbenchError as exc:
        raise pytest.UsageError(f"--cutbench-scenario: {exc}") from None
    added: list[pytest.Item | pytest.Collector] = [
        GateItem.from_parent(session, name=test_id, nodeid=f"{path}::{test_id}", scenario_path=path, arm_label=label)
             # The node id reads like a file's test: ``scenarios/gate.toml::gate:criu/idempotent/kill``.
             for path, label, test_id in params]
    items.extend(item for item in added if isinstance(item, pytest.Item))
    # Reported as collected, as a file's items are: the count pytest prints, and --collect-only's, include them.
    config.hook.pytest_collectreport(report=pytest.CollectReport("", "passed", None, added))


# -- marker + fixture parametrization ---------------------------------------------


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if _RUN_FIXTURE not in metafunc.fixturenames:
        return
    config = metafunc.config
    marker = metafunc.definition.get_closest_marker(MARKER)
    kwargs = marker.kwargs if marker else {}
    patterns = _as_list(kwargs.get("scenario"))
    if not patterns and config.getoption("--cutbench-scenario"):
        patterns = config.getoption("--cutbench-scenario")
        config.stash[_CLI_PARAMETRIZED] = True
    if not patterns:
        metafunc.parametrize(_RUN_FIXTURE, [None], indirect=True, ids=["no-scenario"])
        return
    backends = config.getoption("--cutbench-backend") or _as_list(kwargs.get("backend"))
    overrides = _as_list(kwargs.get("set"))
    from cutbench.errors import CutbenchError

    try:
        params = _arm_params(patterns, Path(str(metafunc.definition.path)).parent, backends, overrides)
    except CutbenchError as exc:
        # A collection error of the test's module in one line, as the command line says it: no traceback.
        raise pytest.Collector.CollectError(f"{metafunc.definition.nodeid}: cutbench marker: {exc}") from None
    metafunc.parametrize(_RUN_FIXTURE, [(p, label, backends, overrides) for p, label, _ in params], indirect=True,
                         ids=[test_id for _, _, test_id in params])


class GateRun:
    """What the ``cutbench_run`` fixture gives a test: one arm run, judged against the gate."""

    def __init__(self, result: Any, outcome_trials: Any):
        self.result = result
        self.trials = outcome_trials

    @property
    def passed(self) -> bool:
        """True when the arm passes the gate."""
        return self.result.passed

    @property
    def run_dir(self) -> Path:
        """The stored run (``report.html`` inside)."""
        return self.result.run_dir

    @property
    def verdict(self) -> Any:
        """The run's :class:`cutbench.harness.reports.summary.RunVerdict`."""
        return self.result.verdict

    @property
    def replay_commands(self) -> list[str]:
        """Return ``cutbench replay`` commands of the failing trials."""
        return [f["replay"] for f in self.result.failing]

    def check(self) -> None:
        """Fail the test (with every failing trial and its replay command) unless the gate passes."""
        if not self.result.passed:
            pytest.fail(self.result.message(), pytrace=False)


@pytest.fixture
def cutbench_run(request: pytest.FixtureRequest) -> GateRun:
    """One arm of a scenario, run and judged: parametrized from the ``cutbench`` marker or ``--cutbench-scenario``."""
    param = getattr(request, "param", None)
    if param is None:
        pytest.fail("cutbench_run needs a scenario: mark the test @pytest.mark.cutbench(scenario='...') "
                    "or pass --cutbench-scenario PATH", pytrace=False)
    path, label, backends, overrides = param
    marker = request.node.get_closest_marker(MARKER)
    result = _run_gate(request.config, path, label, backends, overrides, _max_rate(request.config, marker))
    request.node.user_properties.extend(result.properties())
    from cutbench.harness.store.rundir import RunDir

    return GateRun(result, RunDir.open(result.run_dir).table("trials"))


def _trial_source(request: pytest.FixtureRequest, *, named_workload: bool) -> tuple[Path | None, list[str], list[str]]:
    """Where ``cutbench_trial`` takes its workload and arm from: ``(scenario file, --set overrides, backends)``.

    The test's ``cutbench`` marker first (its ``scenario``, ``set`` and ``backend``), else one
    ``--cutbench-scenario`` unless the call names its workload (the command line's scenarios are the gate's, not
    a call's that says what it runs); ``(None, [], backends)`` when there is neither (the call must then name
    the workload).
    """
    from cutbench.harness.integrations import gate
    from cutbench.errors import InvalidArgument

    config = request.config
    marker = request.node.get_closest_marker(MARKER)
    kwargs = marker.kwargs if marker else {}
    backends = config.getoption("--cutbench-backend") or _as_list(kwargs.get("backend"))
    patterns = _as_list(kwargs.get("scenario")) or ([] if named_workload else config.getoption("--cutbench-scenario"))
    if not patterns:
        return None, [], backends
    found = gate.find_scenarios(patterns, Path(str(request.node.path)).parent)
    if len(found) != 1:
        raise InvalidArgument(f"cutbench_trial: the scenario {', '.join(patterns)} matches {len(found)} files "
                              f"({', '.join(map(str, found))}); pass scenario='PATH' to pick one")
    return found[0], _as_list(kwargs.get("set")), backends


@pytest.fixture
def cutbench_trial(request: pytest.FixtureRequest) -> Any:
    """A function that runs one trial: ``cutbench_trial("3/publish", fault="leave_running")``.

    The workload, its parameters and the arm come from the test's ``cutbench`` marker (its
    ``scenario``, ``set`` and ``backend``) or a single ``--cutbench-scenario``; the call's keywords
    narrow or override them (``fault``, ``receiver_mode``, ``params``, …: see
    :data:`cutbench.harness.integrations.gate.TRIAL_KEYWORDS`), ``scenario=`` names another file and
    ``arm=`` picks one arm by label. With no scenario the call must name ``workload=``: there is no
    default. Returns a :class:`cutbench.harness.integrations.gate.TrialOutcome` (``.outcome``,
    ``.findings``, ``.valid``, ``.replay_command``). An unavailable backend fails the test (skips it with
    ``--cutbench-allow-skip``).
    """
    from cutbench.harness.integrations import gate
    from cutbench.errors import Unavailable

    def run(plan: Any = "3/publish", *, scenario: str | Path | None = None, arm: str | None = None, **kwargs: Any) -> Any:
        source: Path | None
        overrides: list[str]
        if scenario is not None:  # the call's own file wins over the marker's and the command line's
            near = Path(request.node.path).parent / scenario
            source = near if near.is_file() else Path(scenario)
            overrides, backends = [], request.config.getoption("--cutbench-backend")
        else:
            source, overrides, backends = _trial_source(request, named_workload="workload" in kwargs)
        if backends and "backend" not in kwargs:
            overrides = [*overrides, gate.backends_override(backends)]
        try:
            result = gate.run_trial(_results_root(request.config), gate.trial_scenario(source, overrides, **kwargs),
                                    plan, arm=arm)
        except Unavailable as exc:
            _cannot_run(request.config, f"cutbench: {exc}")
        request.node.user_properties.extend([
            ("cutbench_trial", f"{result.trial_id} {result.outcome}"),
            ("cutbench_replay", result.replay_command),
        ])
        return result

    return run

