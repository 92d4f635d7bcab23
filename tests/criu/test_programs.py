"""Programs that know nothing of cutbench, cut through real CRIU and judged from what they show the outside world
(examples/programs: a Python program's stdout, GROMACS's md.log). What each tool keeps and loses is asserted as
measured (docs/programs.md, "What the examples show")."""

from __future__ import annotations

import json
import os
import re

from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import REPO
from tests.fixtures.run_fixtures import cli

PROGRAMS = REPO / "examples" / "programs"


def run(scenario, out, *extra):
    """``cutbench run SCENARIO --out OUT EXTRA…``; its trials as ``{(backend, fault[, receiver mode]): row}`` with
    the findings' kinds (the mode in the key only where the run has several)."""
    proc = cli("run", str(scenario), "--out", str(out), "--json", *extra, timeout=900)
    assert proc.returncode in (0, 1), proc.stdout[-2000:] + proc.stderr[-3000:]
    trials = pd.read_parquet((out / "latest").resolve() / "trials.parquet")
    several = trials["receiver_mode"].nunique() > 1
    rows = {}
    for row in trials.to_dict("records"):
        row["kinds"] = {f["kind"] for f in json.loads(row["findings"] or "[]")}
        rows[(row["backend"], row["fault"], *((row["receiver_mode"],) if several else ()))] = row
    assert (trials["outcome"] != "unknown").all(), trials[["backend", "fault", "error"]].to_string()
    return rows


def test_an_unmodified_program_s_stdout_under_criu_restart_and_app(criu, tmp_path):
    rows = run(PROGRAMS / "ticker" / "ticker.toml", tmp_path)
    # The system-level cut under kill: the restored program writes on into a fresh pipe, every step once.
    assert rows[("criu", "kill")]["outcome"] == "valid"
    # leave_running: what the original printed after the dump, the restored copy prints again.
    assert rows[("criu", "leave_running")]["kinds"] == {"duplicate"}
    for fault in ("kill", "leave_running"):
        # A requeue starts over: every step before the cut shown again, and the trial is `restarted`.
        restart = rows[("restart", fault)]
        assert restart["kinds"] == {"duplicate", "restarted"} and restart["recomputed_ops"] >= 12
        # Its own --resume: only the steps since its last save (every 10) are shown again, all equal to the reference.
        app = rows[("app", fault)]
        assert app["kinds"] <= {"duplicate"} and not app["recomputed_ops"] >= restart["recomputed_ops"]


def test_an_unmodified_program_s_tcp_connection_to_its_collector_under_criu_and_a_requeue(criu, tmp_path):
    rows = run(PROGRAMS / "ticker" / "carbon.toml", tmp_path)
    # kill: CRIU restores the program's connection established (--tcp-established): every step reaches it once.
    assert rows[("criu", "kill")]["outcome"] == "valid"
    # leave_running: the original's connection is gone, CRIU restores it closed (--tcp-close); the ticker does not
    # reconnect, so its next send fails, in its own last words.
    lost = rows[("criu", "leave_running")]
    assert lost["kinds"] == {"process_lost"} and "BrokenPipeError" in lost["error"], lost["error"]
    # A requeue connects anew and sends every step again.
    assert rows[("restart", "kill")]["kinds"] == {"duplicate", "restarted"}


def test_two_streams_of_one_program_are_judged_each_against_its_own_reference(criu, tmp_path):
    # The ticker's stdout and the log of its saves it appends to (streams.toml), each with its own rule.
    rows = run(PROGRAMS / "ticker" / "streams.toml", tmp_path)
    assert rows[("criu", "kill")]["outcome"] == "valid"

    def streams(row):
        return {re.search(r"\[([^#\]]+)#", f["detail"]).group(1) for f in json.loads(row["findings"]) if f["kind"] == "duplicate"}

    # Its own --resume restarts from its last save: the steps since are shown again, a save never is.
    assert rows[("app", "kill")]["kinds"] == {"duplicate"} and streams(rows[("app", "kill")]) == {"stdout"}
    # A requeue repeats both: every step and every save before the cut.
    assert streams(rows[("restart", "kill")]) == {"stdout", "file:saves.log"}


def test_gromacs_as_it_is_under_criu_its_own_restart_and_a_requeue(criu, gromacs, tmp_path):
    # The analysis keyed by step (idempotent); what a reader of every record sees twice, the ticker's test shows.
    rows = run(PROGRAMS / "gromacs" / "gromacs.toml", tmp_path, "--set", 'receiver.modes=["idempotent"]')
    # CRIU under kill: every energy record once, and md.gro bit for bit the uninterrupted runs'.
    assert rows[("criu", "kill")]["outcome"] == "valid"
    # leave_running: md.log grew after the dump, and CRIU will not restore a file of another size: lost.
    lost = rows[("criu", "leave_running")]
    assert lost["kinds"] == {"process_lost"} and "has bad size" in lost["error"]
    # -cpi: the records since its last checkpoint are logged again, each with the energies first logged, and md.gro
    # is equal: only the work is lost (none when the cut fell on one of its checkpoints).
    for fault in ("kill", "leave_running"):
        app = rows[("app", fault)]
        assert app["outcome"] == "valid", (app["plan"], app["findings"], app["error"])  # what it was, if it ever is not
        # A requeue without -cpi: from step 0 again.
        assert rows[("restart", fault)]["kinds"] == {"restarted"} and rows[("restart", fault)]["recomputed_ops"] >= 60


def test_a_gate_on_a_program_as_it_is_is_a_few_lines_of_toml(criu, pytester: pytest.Pytester, tmp_path):
    gate = REPO / "examples" / "programs" / "ticker" / "gate.toml"
    assert len([line for line in gate.read_text().splitlines() if line and not line.startswith("#")]) <= 14
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--cutbench-scenario", str(gate),
                                           "--cutbench-out", str(tmp_path / "results"))
    result.assert_outcomes(passed=1)


def test_a_streaming_server_as_it_is_judged_from_its_clients_under_three_retry_policies(criu, tmp_path):
    # CRIU alone here: what a requeue does to the clients, the ticker's test and the reference run show.
    proc = cli("run", str(PROGRAMS / "server" / "server.toml"), "--out", str(tmp_path), "--json",
               "--set", 'pipeline.backends=["criu"]', timeout=900)
    assert proc.returncode in (0, 1), proc.stdout[-2000:] + proc.stderr[-3000:]
    trials = pd.read_parquet((tmp_path / "latest").resolve() / "trials.parquet")
    assert (trials["outcome"] != "unknown").all(), trials[["variant", "backend", "fault", "error"]].to_string()
    kinds = {(r["variant"], r["backend"], r["fault"]): {f["kind"] for f in json.loads(r["findings"] or "[]")}
             for r in trials.to_dict("records")}
    # What a broken stream leaves each policy's clients with.
    broken = {"give_up": {"missing"}, "same_id": {"duplicate"}, "new_id": {"missing", "mixed_epoch"}}
    for policy, signature in broken.items():
        # A preemption through CRIU: the clients' connections come back established, every token once; only a
        # connection still waiting to be accepted at the cut is left out (--skip-in-flight) and its client reset.
        assert kinds[(policy, "criu", "kill")] <= signature
    assert any(kinds[(policy, "criu", "kill")] == set() for policy in broken)
    # After leave_running the streams in flight break; what the clients then see is their policy's doing:
    # giving up loses the rest, asking again with the same id sees the first tokens twice, a new id gets tokens
    # the uninterrupted runs never sent under that id and loses the old request's rest.
    assert kinds[("give_up", "criu", "leave_running")] == {"missing"}
    assert kinds[("same_id", "criu", "leave_running")] == {"duplicate"}
    assert kinds[("new_id", "criu", "leave_running")] == {"missing", "mixed_epoch"}


def test_the_search_finds_and_shrinks_a_cut_of_a_program(criu, tmp_path):
    # The adaptive source records the program's ground truth before its first trial, as a planned run does. It
    # draws where the cut lands among the three placements (the k-th effect, k x 10 ms, k x 64 bytes: within the
    # ticker's run at every k drawn) and shrinks to the first.
    proc = cli("run", str(PROGRAMS / "ticker" / "ticker.toml"), "--out", str(tmp_path), "--json",
               "--set", "plan.source=hypothesis", "--set", "plan.trials=4", "--set", 'pipeline.backends=["criu"]',
               "--set", 'pipeline.faults=["leave_running"]', "--set", "plan.ops=[5, 30]",
               "--set", 'plan.phases=["effect", "time", "size"]', "--set", "workload.params.cut_time_ms=10",
               "--set", "workload.params.cut_bytes=64", timeout=600)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    search = json.loads(((tmp_path / "latest").resolve() / "search.json").read_text())
    (arm,) = search["arms"]
    (cut,) = arm["minimal_plan"]["cuts"]
    assert (cut["op"], cut["phase"], cut["mode"]) == (5, "effect", "async") and arm["reproduced"], arm
    trials = pd.read_parquet((tmp_path / "latest").resolve() / "trials.parquet")
    assert (trials["outcome"] != "unknown").all(), trials[["cut_phase", "cut_op", "error"]].to_string()


def test_a_gate_records_a_program_s_ground_truth_once_for_all_its_arms(criu, pytester: pytest.Pytester, tmp_path):
    # Each arm is a run of its own, and each recorded the program's two uninterrupted runs again: four arms took the
    # gate 48-60 s where the command took 28-35 s. The program says each start of it in a file outside its trials.
    starts = tmp_path / "starts.log"
    (pytester.path / "ticker.py").write_text((PROGRAMS / "ticker" / "ticker.py").read_text())
    (pytester.path / "gate.toml").write_text(f"""
name = "twice"
[workload]
name = "program"
[workload.params]
command = ["sh", "-c", "echo start >> {starts}; exec python3 ticker.py --steps 30 --interval-ms 15"]
files = ["ticker.py"]
effects = '^step (?P<index>\\d+) (?P<payload>\\w+)$'
ops = 30
[pipeline]
backends = ["criu"]
faults = ["kill", "leave_running"]
[plan]
source = "random"
trials = 1
cut_mode = "async"
ops = [5, 10]
phases = ["effect"]
""")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--cutbench-scenario", "gate.toml",
                                           "--cutbench-max-invalid-rate", "1", "--cutbench-out", str(tmp_path / "results"))
    result.assert_outcomes(passed=2)
    # Two uninterrupted runs for the session, then one start per trial (a CRIU restore is no start).
    assert starts.read_text().count("start") == 4, result.stdout.str()[-3000:]
    runs = [d for d in (tmp_path / "results").iterdir() if d.is_dir() and d.name != "latest"]
    # Each arm's run stores the ground truth it was judged by (for analyze, replay and --resume).
    assert len(runs) == 2 and all(len(list((d / "references").glob("*.json"))) == 1 for d in runs)


def test_a_tool_s_own_option_is_an_arm_axis_and_its_refusal_says_which(criu, tmp_path):
    # A SQLite worker's open write-ahead-logged database holds a lock CRIU dumps only when told --file-locks: the
    # scenario runs without and with it side by side (pipeline.criu_options), and the refusal names the option.
    proc = cli("run", str(PROGRAMS / "jobs" / "jobs.toml"), "--out", str(tmp_path), "--json",
               "--set", 'pipeline.backends=["criu"]', "--set", 'receiver.modes=["idempotent"]', timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    run_dir = (tmp_path / "latest").resolve()
    trials = pd.read_parquet(run_dir / "trials.parquet")
    by = {r["criu_options"]: r for r in trials.to_dict("records")}
    assert set(by) == {"", "--file-locks"}
    assert by[""]["outcome"] == "refused" and "You can try --file-locks" in by[""]["error"]
    assert by["--file-locks"]["outcome"] == "valid" and by["--file-locks"]["arm"] == "criu/idempotent/kill/criu:file-locks"
    summary = (run_dir / "summary.md").read_text()
    assert "## Refused trials" in summary and 'pipeline.criu_options = [[], ["--file-locks"]]' in summary
    assert 'criu_options = [\n    [],\n    [\n        "--file-locks",' in (run_dir / "run.toml").read_text()


def test_a_program_cut_at_its_system_calls_shows_each_order_s_defect_at_its_boundaries(criu, tmp_path):
    # The boundaries of job 5 of the SQLite worker after its announcement's first write (its calls 44-46), in both
    # orders, through CRIU and its own --resume: each trial lands on its boundary, so the defect is caught at
    # exactly the boundaries it lives at (every boundary of the job: examples/programs/jobs/syscalls.toml).
    proc = cli("run", str(PROGRAMS / "jobs" / "syscalls.toml"), "--out", str(tmp_path), "--json",
               "--set", 'receiver.modes=["at_least_once"]', "--set", "plan.ops=[44, 46]", timeout=900)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-3000:]
    trials = pd.read_parquet((tmp_path / "latest").resolve() / "trials.parquet")
    assert len(trials) == 12 and (trials["outcome"] != "unknown").all(), trials[["arm", "cut_op", "error"]].to_string()
    # CRIU restores the process at the boundary: every one valid, in either order.
    assert (trials[trials["backend"] == "criu"]["outcome"] == "valid").all()
    app = trials[trials["backend"] == "app"]
    broken = {v: {(int(r["cut_op"]), r["boundary"]): {f["kind"] for f in json.loads(r["findings"])}
                  for r in g.to_dict("records") if r["outcome"] == "invalid"} for v, g in app.groupby("variant")}
    # Announced, not yet in the write-ahead log: started again it does job 5 again and announces it twice.
    assert sorted(op for op, _ in broken["announce-commit"]) == [44, 45, 46]
    assert all(kinds == {"duplicate"} for kinds in broken["announce-commit"].values())
    assert ("after write(stdout) `done 5 " in next(name for op, name in broken["announce-commit"] if op == 44))
    # In the write-ahead log (a killed process's pwrite64 is in the page cache), not yet announced: never announced.
    assert sorted(op for op, _ in broken["commit-announce"]) == [45, 46]
    assert all(kinds == {"missing"} for kinds in broken["commit-announce"].values())
    assert [name for op, name in broken["commit-announce"] if op == 46][0].endswith(
        "before write(stdout) `done 5 92e9316162a676c39a125e4a7…`")


def test_a_plan_beyond_the_program_s_counted_calls_is_refused_before_any_trial(criu, tmp_path):
    mark = f"CUTBENCH_TEST_{os.getpid()}"  # in the program's environment: its processes, not another test's
    proc = cli("run", str(PROGRAMS / "jobs" / "syscalls.toml"), "--out", str(tmp_path), "--variant", "announce-commit",
               "--set", "plan.ops=[500, 500]", "--set", 'pipeline.backends=["criu"]',
               "--set", f'workload.params.env={{ {mark} = "1" }}', timeout=300)
    assert proc.returncode == 254, proc.stderr[-2000:]
    assert "plan.ops: a cut at counted system call 500, but the program makes 90 calls of plan.syscalls" in proc.stderr
    left = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and f"{mark}=1".encode() in (entry / "environ").read_bytes():
                left.append(int(entry.name))
        except OSError:
            continue
    assert left == []
