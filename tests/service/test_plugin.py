"""The pytest plugin, driven through ``pytester`` in subprocesses (gate runs are ``criu``: must run in CI)."""

from __future__ import annotations


import pytest

from tests.fixtures.run_fixtures import FAILING_SCENARIO, counter_scenario


FOUR_ARMS = counter_scenario("four", modes=["at_least_once", "idempotent"], faults=["kill", "leave_running"], phases=["publish"])


def test_plugin_is_inert_unless_used(pytester: pytest.Pytester):
    """Loaded by every pytest run: it must import nothing of cutbench's machinery and add no test."""
    pytester.makepyfile(test_plain="""
        import sys

        def test_nothing_heavy_was_imported():
            heavy = [m for m in ("cutbench.harness.integrations.gate", "cutbench.harness.runner.run",
                                 "cutbench.harness.model.scenario", "pandas", "matplotlib") if m in sys.modules]
            assert not heavy, heavy
    """)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    assert "cutbench" in pytester.runpytest_subprocess("--help").stdout.str()


def test_marker_makes_one_test_per_arm(pytester: pytest.Pytester):
    (pytester.path / "scenarios").mkdir()
    (pytester.path / "scenarios" / "four.toml").write_text(FOUR_ARMS)
    (pytester.path / "scenarios" / "one.toml").write_text(FAILING_SCENARIO)
    pytester.makepyfile(test_gate="""
        import pytest

        @pytest.mark.cutbench(scenario="scenarios/*.toml")
        def test_gate(cutbench_run):
            cutbench_run.check()
    """)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--collect-only", "-q")
    ids = sorted(line for line in result.stdout.lines if line.startswith("test_gate.py::"))
    assert ids == sorted([
        "test_gate.py::test_gate[failing:criu/at_least_once/leave_running+100ms]",
        "test_gate.py::test_gate[four:criu/at_least_once/kill]",
        "test_gate.py::test_gate[four:criu/at_least_once/leave_running+100ms]",
        "test_gate.py::test_gate[four:criu/idempotent/kill]",
        "test_gate.py::test_gate[four:criu/idempotent/leave_running+100ms]",
    ])
    # Without a marker, --cutbench-scenario parametrizes the user's gate test (and adds no gate items of its own).
    pytester.makepyfile(test_plain_gate="def test_gate(cutbench_run):\n    cutbench_run.check()\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--collect-only", "-q", "test_plain_gate.py",
                                           "--cutbench-scenario", "scenarios/four.toml")
    lines = [line for line in result.stdout.lines if "::" in line]
    assert len(lines) == 4 and all(line.startswith("test_plain_gate.py::test_gate[four:") for line in lines), lines


def test_gate_items_from_the_command_line(pytester: pytest.Pytester):
    (pytester.path / "four.toml").write_text(FOUR_ARMS)
    pytester.makepyfile(test_other="def test_other():\n    pass\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--collect-only", "-q", "--cutbench-scenario", "four.toml",
                                           "-k", "idempotent")
    lines = [line for line in result.stdout.lines if "::" in line]
    assert lines == ["four.toml::four:criu/idempotent/kill", "four.toml::four:criu/idempotent/leave_running+100ms"], result.stdout.str()


def test_bad_scenario_is_a_usage_error(pytester: pytest.Pytester):
    (pytester.path / "bad.toml").write_text('[plan]\nsource = "sometimes"\n')
    pytester.makepyfile(test_other="def test_other():\n    pass\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--cutbench-scenario", "bad.toml")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "plan.source = 'sometimes': allowed exhaustive, random, hypothesis" in result.stderr.str()
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--cutbench-scenario", "missing.toml")
    assert result.ret == pytest.ExitCode.USAGE_ERROR and "no such file" in result.stderr.str()


def test_the_command_line_s_scenario_is_gated_beside_a_marked_test_that_names_its_own(pytester: pytest.Pytester):
    # A user gating a buggy build ran `pytest --cutbench-scenario buggy.toml` where a marked test names correct.toml:
    # only the marker's ran, and nothing said so. Both apply, and the count pytest prints includes both.
    (pytester.path / "correct.toml").write_text(FOUR_ARMS)
    (pytester.path / "buggy.toml").write_text(FAILING_SCENARIO)
    pytester.makepyfile(test_gate="""
        import pytest

        @pytest.mark.cutbench(scenario="correct.toml")
        def test_gate(cutbench_run):
            cutbench_run.check()
    """)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--collect-only", "-q", "--cutbench-scenario",
                                           "buggy.toml", "-k", "kill or failing")
    lines = [line for line in result.stdout.lines if "::" in line]
    assert lines == ["test_gate.py::test_gate[four:criu/at_least_once/kill]", "test_gate.py::test_gate[four:criu/idempotent/kill]",
                     "buggy.toml::failing:criu/at_least_once/leave_running+100ms"], result.stdout.str()
    # --collect-only counts the gate items it lists (it said "collected 0 items" and "no tests collected").
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--collect-only", "--cutbench-scenario", "buggy.toml")
    assert "collected 5 items" in result.stdout.str() and "5 tests collected" in result.stdout.str(), result.stdout.str()


def test_a_scenario_a_run_would_refuse_is_one_line_at_collection(pytester: pytest.Pytester):
    # A program's file that is not there: the command line says it in one line before any trial, and so does the
    # gate, with no traceback of pytest's or cutbench's (it printed 1,117 lines, the message last).
    (pytester.path / "gate.toml").write_text(PROGRAM_NAMING.replace("FILES", '["job.txt"]'))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--cutbench-scenario", "gate.toml")
    said = "workload.params.files: " + str(pytester.path / "job.txt") + " not found"
    assert result.ret == pytest.ExitCode.USAGE_ERROR and f"ERROR: --cutbench-scenario: {said}" in result.stderr.str()
    assert "Traceback" not in result.stdout.str() + result.stderr.str()
    pytester.makepyfile(test_gate="""
        import pytest

        @pytest.mark.cutbench(scenario="gate.toml")
        def test_gate(cutbench_run):
            cutbench_run.check()
    """)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(errors=1)
    text = result.stdout.str()
    assert f"test_gate.py::test_gate: cutbench marker: {said}" in text and "site-packages" not in text, text
    assert len(text.splitlines()) < 20, text


# A program gate whose workload.params.files is FILES (the ticker's command, which needs no file to be judged).
PROGRAM_NAMING = """
name = "program-gate"
[workload]
name = "program"
params = { command = ["python3", "-c", "print('step 1 a')"], files = FILES, effects = '^step (?P<index>\\d+) (?P<payload>\\w+)$', ops = 1 }
[pipeline]
backends = ["criu"]
faults = ["kill"]
[plan]
source = "random"
trials = 1
cut_mode = "async"
ops = [1, 1]
phases = ["effect"]
"""


def test_run_fixture_without_a_scenario_fails_clearly(pytester: pytest.Pytester):
    pytester.makepyfile(test_gate="def test_gate(cutbench_run):\n    pass\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(errors=1)
    assert "cutbench_run needs a scenario" in result.stdout.str()


def test_scenario_variants_make_one_item_per_variant_and_arm(pytester: pytest.Pytester):
    (pytester.path / "two.toml").write_text(FAILING_SCENARIO + '\n[[variants]]\nname = "small"\n\n[[variants]]\n'
                                            'name = "big"\nworkload = { params = { state_size = 65536 } }\n')
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--collect-only", "-q", "--cutbench-scenario", "two.toml")
    lines = [line for line in result.stdout.lines if "::" in line]
    assert lines == ["two.toml::failing:small:criu/at_least_once/leave_running+100ms",
                     "two.toml::failing:big:criu/at_least_once/leave_running+100ms"], result.stdout.str()


def test_a_gate_that_cannot_run_fails_unless_skipping_is_allowed(pytester: pytest.Pytester, monkeypatch):
    """An arm whose backend is unusable here tested nothing: the gate fails; --cutbench-allow-skip skips it."""
    monkeypatch.delenv("CUTBENCH_CRIU_PLUGIN_DIR", raising=False)
    (pytester.path / "one.toml").write_text(FAILING_SCENARIO)
    pytester.makepyfile(test_gate="""
        import pytest

        @pytest.mark.cutbench(scenario="one.toml", backend="criu-cuda-plugin")
        def test_gate(cutbench_run):
            cutbench_run.check()

        def test_trial(cutbench_trial):
            cutbench_trial("3/publish", workload="counter", backend="criu-cuda-plugin")
    """)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1, errors=1)  # the gate arm fails in its fixture: an error, a failing session
    assert result.ret != 0
    assert "cannot run here" in result.stdout.str() and "--cutbench-allow-skip" in result.stdout.str()
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--cutbench-allow-skip")
    result.assert_outcomes(skipped=2)


def test_a_trial_that_names_its_workload_is_not_drawn_from_the_command_line_s_scenarios(pytester: pytest.Pytester,
                                                                                         monkeypatch):
    """``--cutbench-scenario`` is the gate's; a call that says what it runs (workload=, scenario=) is not redirected."""
    monkeypatch.delenv("CUTBENCH_CRIU_PLUGIN_DIR", raising=False)
    (pytester.path / "gates").mkdir()
    for name in ("a", "b"):
        (pytester.path / "gates" / f"{name}.toml").write_text(FAILING_SCENARIO)
    (pytester.path / "mine.toml").write_text(FAILING_SCENARIO.replace('backends = ["criu"]', 'backends = ["criu-cuda-plugin"]'))
    pytester.makepyfile(test_trials="""
        def test_named(cutbench_trial):
            cutbench_trial("3/publish", workload="counter", backend="criu-cuda-plugin")

        def test_own_file(cutbench_trial):
            cutbench_trial("3/publish", scenario="mine.toml")

        def test_drawn(cutbench_trial):
            cutbench_trial("3/publish")
    """)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--cutbench-scenario", "gates/*.toml", "-k", "test_")
    text = result.stdout.str()
    result.assert_outcomes(failed=3)
    # The two that say what they run reach the backend (unusable here); the one that does not is told to pick a file.
    summary = {line.split(" - ")[0].split("::")[-1]: line for line in text.splitlines() if line.startswith("FAILED")}
    assert "Failed: cutbench: backend 'criu-cuda-p" in summary["test_named"]
    assert "Failed: cutbench: backend 'criu-cuda-p" in summary["test_own_file"]
    assert "InvalidArgument" in summary["test_drawn"] and "matches 2 files" in text


def test_no_gate_entry_point_defaults_the_workload():
    """The gate and the plugin never run a workload nobody named: no keyword of theirs defaults to one."""
    import ast

    from tests.conftest import REPO

    for path in (REPO / "harness" / "integrations" / "gate.py", REPO / "harness" / "integrations" / "pytest_plugin.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and any(isinstance(a, ast.Constant) and a.value == "workload.name" for a in node.args):
                assert False, f"{path.name}:{node.lineno} reads the default workload"
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                args = node.args
                named = [*args.posonlyargs, *args.args][-len(args.defaults):] if args.defaults else []
                pairs = [*zip(named, args.defaults), *zip(args.kwonlyargs, args.kw_defaults)]
                for arg, default in pairs:
                    if arg.arg in ("workload", "scenario") and default is not None:
                        assert isinstance(default, ast.Constant) and default.value is None, \
                            f"{path.name}:{node.lineno} {node.name}({arg.arg}=…) has a default"
