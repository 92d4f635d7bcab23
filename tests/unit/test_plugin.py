"""The pytest plugin, driven through ``pytester`` in subprocesses (gate runs are ``criu``: must run in CI)."""

from __future__ import annotations

import json
import re
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.fixtures.run_fixtures import cli, counter_scenario

pytest_plugins = ["pytester"]

# One arm, one cut point where an at-least-once receiver sees the replayed
# publish after a leave_running crash: the gate must fail.
FAILING = counter_scenario("failing", modes=["at_least_once"], faults=["leave_running"], phases=["publish"])
FOUR_ARMS = counter_scenario("four", modes=["at_least_once", "idempotent"], faults=["kill", "leave_running"], phases=["publish"])


def test_plugin_is_inert_unless_used(pytester: pytest.Pytester):
    """Loaded by every pytest run: it must import nothing of cutbench's machinery and add no test."""
    pytester.makepyfile(test_plain="""
        import sys

        def test_nothing_heavy_was_imported():
            heavy = [m for m in ("cutbench.harness.integrations.gate", "cutbench.harness.runner.run", "cutbench.harness.model.scenario", "pandas", "matplotlib") if m in sys.modules]
            assert not heavy, heavy
    """)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    assert "cutbench" in pytester.runpytest_subprocess("--help").stdout.str()


@pytest.mark.criu
def test_failing_gate_exits_nonzero_and_prints_the_replay_command(criu, pytester: pytest.Pytester, tmp_path: Path):
    scenario = pytester.path / "failing.toml"
    scenario.write_text(FAILING)
    out, xml = tmp_path / "gate-results", tmp_path / "gate.xml"
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--cutbench-scenario", str(scenario),
                                           "--cutbench-out", str(out), f"--junitxml={xml}")
    assert result.ret == 1
    result.assert_outcomes(failed=1)
    text = result.stdout.str()
    assert "cutbench gate FAILED for failing [criu/at_least_once/leave_running+100ms]" in text
    match = re.search(r"replay: cutbench replay (\S+\.json)", text)
    assert match, text
    trial_file = Path(match.group(1))
    assert trial_file.is_file() and trial_file.is_relative_to(out)

    props = [(p.get("name"), p.get("value")) for p in ET.parse(xml).getroot().iter("property")]
    assert ("cutbench_gate", "failed") in props
    assert ("cutbench_invalid", "1") in props
    assert ("cutbench_replay", f"cutbench replay {trial_file}") in props
    assert any(name == "cutbench_finding" and "duplicate" in value for name, value in props)

    # The printed command reproduces the failure.
    replay = cli("replay", str(trial_file), "--out", str(tmp_path / "replayed"), "--json")
    assert replay.returncode == 1, replay.stderr[-2000:]
    assert json.loads(replay.stdout)["replayed"] == "invalid"


@pytest.mark.criu
def test_threshold_option_lets_the_same_run_pass(criu, pytester: pytest.Pytester, tmp_path: Path):
    scenario = pytester.path / "failing.toml"
    scenario.write_text(FAILING)
    xml = tmp_path / "gate.xml"
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--cutbench-scenario", str(scenario),
                                           "--cutbench-max-invalid-rate", "1", f"--junitxml={xml}")
    result.assert_outcomes(passed=1)
    props = dict((p.get("name"), p.get("value")) for p in ET.parse(xml).getroot().iter("property"))
    assert props["cutbench_gate"] == "passed" and props["cutbench_invalid_rate"] == "1.000000"


def test_marker_makes_one_test_per_arm(pytester: pytest.Pytester):
    (pytester.path / "scenarios").mkdir()
    (pytester.path / "scenarios" / "four.toml").write_text(FOUR_ARMS)
    (pytester.path / "scenarios" / "one.toml").write_text(FAILING)
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


def test_run_fixture_without_a_scenario_fails_clearly(pytester: pytest.Pytester):
    pytester.makepyfile(test_gate="def test_gate(cutbench_run):\n    pass\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(errors=1)
    assert "cutbench_run needs a scenario" in result.stdout.str()


@pytest.mark.criu
def test_trial_fixture_runs_one_trial(criu, pytester: pytest.Pytester):
    pytester.makepyfile(test_trial="""
        def test_duplicate_after_crash(cutbench_trial, record_property):
            result = cutbench_trial("2/publish", receiver_mode="at_least_once", fault="leave_running", crash_after_ms=100,
                                    array="numpy", params={"ops": 4, "op_interval_ms": 20.0})
            assert result.outcome == "invalid"
            assert {f["kind"] for f in result.findings} == {"duplicate"}
            assert result.trial_file.is_file() and result.replay_command.startswith("cutbench replay ")

        def test_bad_argument(cutbench_trial):
            import pytest
            from cutbench.errors import InvalidArgument
            with pytest.raises(InvalidArgument, match="receiver.modes contains 'sometimes'"):
                cutbench_trial("2/publish", receiver_mode="sometimes")
    """)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)


@pytest.mark.criu
def test_the_ci_gate_example_passes(criu, pytester: pytest.Pytester, tmp_path: Path):
    example = REPO / "examples" / "ci_gate"
    shutil.copytree(example, pytester.path, dirs_exist_ok=True)
    xml = tmp_path / "gate.xml"
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "test_gate.py", "--cutbench-out", str(tmp_path / "results"),
                                           f"--junitxml={xml}")
    result.assert_outcomes(passed=3)
    props = [(p.get("name"), p.get("value")) for p in ET.parse(xml).getroot().iter("property")]
    assert props.count(("cutbench_gate", "passed")) == 2


def test_scenario_variants_make_one_item_per_variant_and_arm(pytester: pytest.Pytester):
    (pytester.path / "two.toml").write_text(FAILING + '\n[[variants]]\nname = "small"\n\n[[variants]]\nname = "big"\n'
                                            'workload = { params = { state_size = 65536 } }\n')
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--collect-only", "-q", "--cutbench-scenario", "two.toml")
    lines = [line for line in result.stdout.lines if "::" in line]
    assert lines == ["two.toml::failing:small:criu/at_least_once/leave_running+100ms",
                     "two.toml::failing:big:criu/at_least_once/leave_running+100ms"], result.stdout.str()
