"""The pytest plugin as a CI gate on real CRIU runs: pass, fail with replay commands, JUnit properties."""

from __future__ import annotations

import json
import re
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.fixtures.run_fixtures import FAILING_SCENARIO, cli


@pytest.mark.criu
def test_failing_gate_exits_nonzero_and_prints_the_replay_command(criu, pytester: pytest.Pytester, tmp_path: Path):
    scenario = pytester.path / "failing.toml"
    scenario.write_text(FAILING_SCENARIO)
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
    assert replay.returncode == 0, replay.stderr[-2000:]  # 0: the verdict reproduced
    assert json.loads(replay.stdout)["replayed"] == "invalid"


@pytest.mark.criu
def test_threshold_option_lets_the_same_run_pass(criu, pytester: pytest.Pytester, tmp_path: Path):
    scenario = pytester.path / "failing.toml"
    scenario.write_text(FAILING_SCENARIO)
    xml = tmp_path / "gate.xml"
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--cutbench-scenario", str(scenario),
                                           "--cutbench-max-invalid-rate", "1", f"--junitxml={xml}")
    result.assert_outcomes(passed=1)
    props = dict((p.get("name"), p.get("value")) for p in ET.parse(xml).getroot().iter("property"))
    assert props["cutbench_gate"] == "passed" and props["cutbench_invalid_rate"] == "1.000000"


@pytest.mark.criu
def test_trial_fixture_runs_one_trial(criu, pytester: pytest.Pytester):
    pytester.makepyfile(test_trial="""
        def test_duplicate_after_crash(cutbench_trial, record_property):
            result = cutbench_trial("2/publish", workload="counter", receiver_mode="at_least_once", fault="leave_running",
                                    crash_after_ms=100, array="numpy", params={"ops": 4, "op_interval_ms": 20.0})
            assert result.outcome == "invalid"
            assert {f["kind"] for f in result.findings} == {"duplicate"}
            assert result.trial_file.is_file() and result.replay_command.startswith("cutbench replay ")

        def test_bad_argument(cutbench_trial):
            import pytest
            from cutbench.errors import InvalidArgument
            with pytest.raises(InvalidArgument, match="receiver.modes contains 'sometimes'"):
                cutbench_trial("2/publish", workload="counter", receiver_mode="sometimes")

        def test_no_default_workload(cutbench_trial):
            import pytest
            from cutbench.errors import InvalidArgument
            with pytest.raises(InvalidArgument, match="no workload named"):
                cutbench_trial("2/publish", fault="kill")
    """)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=3)


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


# A user's own workloads, in a folder of their project found through a relative PYTHONPATH (as `PYTHONPATH=mywl`):
# a correct order book and one that marks its journal before it sends (a restore after the mark skips the send).
ORDERBOOK = """
from cutbench.workloads.variants import Outbox, OutboxMarkBeforeSend


class Book(Outbox):
    name = "book"


class BuggyBook(OutboxMarkBeforeSend):
    name = "buggy_book"
"""
BOOK_GATE = """
name = "book-gate"
[workload]
name = "orderbook:Book"
array = "numpy"
params = { ops = 4, op_interval_ms = 20.0 }
[receiver]
modes = ["idempotent"]
[pipeline]
backends = ["criu"]
faults = ["kill"]
[plan]
source = "exhaustive"
ops = [2, 2]
phases = ["outbox"]
[run]
watchdog_s = 15
trial_timeout_s = 60
"""


@pytest.mark.criu
def test_the_marker_and_the_trial_fixture_gate_the_buggy_variant_and_fail(criu, pytester: pytest.Pytester, monkeypatch,
                                                                            tmp_path: Path):
    (pytester.path / "mywl").mkdir()
    (pytester.path / "mywl" / "orderbook.py").write_text(ORDERBOOK)
    (pytester.path / "gate.toml").write_text(BOOK_GATE)
    pytester.makepyfile(test_book="""
        import pytest

        pytestmark = pytest.mark.cutbench(scenario="gate.toml", set=['workload.name="orderbook:BuggyBook"'])

        def test_gate(cutbench_run):
            cutbench_run.check()

        def test_trial(cutbench_trial):
            result = cutbench_trial("2/outbox")
            assert result.valid, result.findings
    """)
    monkeypatch.setenv("PYTHONPATH", "mywl")  # relative: the trial's process starts elsewhere
    out = tmp_path / "results"
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--cutbench-out", str(out))
    result.assert_outcomes(failed=2)
    text = result.stdout.str()
    # In summary.md's words: what the cut did and what the receiver missed.
    assert "committed op 2, but the receiver never applied it" in text and "ended unknown" not in text, text
    stored = [json.loads(p.read_text()) for p in out.glob("*/trials/t0001.json") if not p.parents[1].is_symlink()]
    assert len(stored) == 2 and {s["spec"]["workload"] for s in stored} == {"orderbook:BuggyBook"}
    assert all(s["spec"]["workload_path"] == [str(pytester.path / "mywl")] for s in stored)

    # The printed replay command works when pasted elsewhere, with no PYTHONPATH.
    monkeypatch.delenv("PYTHONPATH")
    trial_file = next(p for p in out.glob("*-trial-*/trials/t0001.json") if not p.parents[1].is_symlink())
    replay = cli("replay", str(trial_file), "--out", str(tmp_path / "replayed"), "--json")
    assert replay.returncode == 0, replay.stderr[-2000:]
    assert json.loads(replay.stdout)["replayed"] == "invalid"
    analyzed = cli("analyze", str(trial_file.parent.parent))
    assert analyzed.returncode == 0 and "0 verdicts differ" in analyzed.stderr + analyzed.stdout, analyzed.stderr
    # Where the workload is gone, nothing can be re-judged: that is said once (254), not as changed verdicts.
    (pytester.path / "mywl").rename(pytester.path / "elsewhere")
    analyzed = cli("analyze", str(trial_file.parent.parent))
    assert analyzed.returncode == 254 and "cannot re-judge trial t0001 here" in analyzed.stderr, analyzed.stderr
    assert "verdicts differ" not in analyzed.stderr + analyzed.stdout
    (pytester.path / "elsewhere").rename(pytester.path / "mywl")

    # The correct twin on the same cut is valid: the gate tells the two apart.
    monkeypatch.syspath_prepend(str(pytester.path / "mywl"))
    from cutbench.harness.integrations import gate

    twin = gate.trial_scenario(pytester.path / "gate.toml")
    assert gate.run_trial(tmp_path / "twin", twin, "2/outbox").outcome == "valid"

