"""A program as it is, through its outside world: the observer on real processes (pipes, a log that is truncated or
replaced, as a restart does), and every bad input refused before any trial with exit 254 and nothing kept
(docs/programs.md, "Bad input")."""

from __future__ import annotations

import socket
import sys
import textwrap
from pathlib import Path

import pytest

from cutbench.harness.observer.streams import Observer
from cutbench.workloads import api
from cutbench.workloads.program import Program
from tests.fixtures.run_fixtures import cli


def observe(tmp_path: Path, script: str, **over) -> Observer:
    """Run ``script`` (Python) as a program in ``tmp_path`` under an observer; return the observer once it ended."""
    (tmp_path / "prog.py").write_text(textwrap.dedent(script))
    params = api.resolve_params(Program, {"command": [sys.executable, "prog.py"], "effects": r"^step (?P<index>\d+)", **over})
    obs = Observer(params, tmp_path)
    child = obs.start(params["command"])
    assert child.wait(30) == 0
    obs.close()
    return obs


def test_a_pipe_s_lines_are_effects_and_stderr_is_the_program_s_last_words(tmp_path):
    obs = observe(tmp_path, """
        import sys
        for i in range(1, 4):
            print(f"step {i}", flush=True)
        print("noise")
        print("done, bye", file=sys.stderr)
    """)
    assert [s.key for s in obs.seen] == ["stdout#1", "stdout#2", "stdout#3"] and obs.lines == 4
    assert obs.last_words() == "done, bye"


def test_a_log_cut_back_and_written_again_is_seen_again_from_where_it_differs(tmp_path):
    # What GROMACS's -cpi -append does to md.log: truncate to the checkpoint, set up (a while), then log those steps
    # again. (A file cut back and written again to the same bytes within one poll is not seen as rewritten.)
    obs = observe(tmp_path, """
        import time
        with open("log.txt", "a") as f:
            for i in range(1, 6):
                f.write(f"step {i}\\n"); f.flush(); time.sleep(0.05)
            time.sleep(0.2)
            f.truncate(len("step 1\\nstep 2\\nstep 3\\n"))
            time.sleep(0.2)
            for i in range(4, 7):
                f.write(f"step {i}\\n"); f.flush(); time.sleep(0.05)
            time.sleep(0.1)
    """, stream="file:log.txt")
    assert [s.index for s in obs.seen] == ["1", "2", "3", "4", "5", "4", "5", "6"]


def test_a_log_replaced_by_a_new_file_is_read_again_from_its_start(tmp_path):
    # What a program started again does when it moves its old log aside (GROMACS: #md.log.1#).
    obs = observe(tmp_path, """
        import os, time
        with open("log.txt", "w") as f:
            for i in range(1, 4):
                f.write(f"step {i}\\n"); f.flush(); time.sleep(0.05)
        time.sleep(0.2)
        os.rename("log.txt", "old.txt")
        with open("log.txt", "w") as f:
            for i in range(1, 3):
                f.write(f"step {i}\\n"); f.flush(); time.sleep(0.05)
        time.sleep(0.1)
    """, stream="file:log.txt")
    assert [s.index for s in obs.seen] == ["1", "2", "3", "1", "2"]


def test_a_socket_the_program_connects_to_is_read_as_its_stream_connection_by_connection(tmp_path):
    # A metrics client: one connection, then a second (a program started again connects anew), then RST on exit.
    (tmp_path / "prog.py").write_text(textwrap.dedent("""
        import socket, struct, sys
        for first in (1, 3):
            conn = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
            conn.sendall(f"step {first}\\nstep {first + 1}\\nnoise\\n".encode())
            conn.close()
        last = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
        last.sendall(b"step 5\\n")
        last.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close with a reset
        last.close()
    """))
    params = api.resolve_params(Program, {"command": [sys.executable, "prog.py", "{port}"], "stream": "socket",
                                          "effects": r"^step (?P<index>\d+)"})
    obs = Observer(params, tmp_path)
    obs.listen(0)
    child = obs.start(Program.command_for(params, obs.port))
    assert child.wait(30) == 0
    obs.close()
    assert sorted(s.key for s in obs.seen) == [f"socket#{i}" for i in range(1, 6)] and obs.lines == 7
    assert obs.bytes == 5 * 7 + 2 * 6 and not obs.rule_error  # "step N\n" x5, "noise\n" x2


def scenario(tmp_path: Path, params: str, *, ops: int = 1) -> Path:
    path = tmp_path / "prog.toml"
    path.write_text(textwrap.dedent(f"""
        name = "bad-program"
        [workload]
        name = "program"
        [workload.params]
        {params}
        ops = {ops}
        [pipeline]
        backends = ["restart"]
        faults = ["kill"]
        [plan]
        cut_mode = "async"
        ops = [1, 1]
        phases = ["effect"]
        [run]
        trial_timeout_s = 30
        stage_timeout_s = 5
    """))
    return path


PRINTS = 'command = ["python3", "-c", "print(\'step 1\'); print(\'step 2\')"]\n'


@pytest.mark.parametrize("params, ops, said", [
    ('command = ["no-such-program-here", "--flag"]\neffects = "x"', 1,
     "workload.params.command = ['no-such-program-here', '--flag']: command 'no-such-program-here' not found on PATH"),
    ('command = ["python3", "-c", "import sys; print(\'it broke here\', file=sys.stderr); sys.exit(3)"]\neffects = "x"', 1,
     "the program ended with exit 3: it broke here"),
    ('command = ["python3", "-c", "print(\'hello\')"]\neffects = "^step"', 1,
     "the effects rule matched nothing in the 1 lines of stdout (its first lines: 'hello')"),
    (PRINTS + 'parser = "broken:make"', 1, "the effects parser raised ZeroDivisionError"),
    (PRINTS + 'parser = "absent_module:make"', 1, "workload.params.parser = 'absent_module:make': cannot make a parser"),
    (PRINTS + 'effects = "^step (?P<index>\\\\d+)"', 3, "workload.params.ops = 3: the program shows 2 effects uninterrupted"),
    ('command = ["true"]\neffects = "x"\nfiles = ["missing.tpr"]', 1, "workload.params.files:"),
    ('command = ["python3", "-c", "import time; time.sleep(60)", "{port}"]\nstream = "http"\neffects = "x"', 1,
     "the server never listened on 127.0.0.1:"),
    ('command = ["python3", "-c", "import sys; sys.exit(\'no model here\')", "{port}"]\nstream = "http"\neffects = "x"', 1,
     "the program exited (1) before it listened on 127.0.0.1:"),
    ('command = ["serve", "{port}"]\nstream = "http"\neffects = "x"\nport = TAKEN', 1, "already taken on 127.0.0.1"),
    ('command = ["serve"]\nstream = "http"\neffects = "x"', 1, 'a server\'s command says where it listens with "{port}"'),
    (PRINTS + 'effects = "^step"\nartefacts = [{ path = "out", compare = "absent_cmp:f" }]', 1,
     "workload.params.artefacts: out: compare = 'absent_cmp:f' cannot be imported"),
    (PRINTS + 'effects = "^step"\nstreams = [{ stream = "stderr", effects = "^never" }]', 1,
     "the effects rule matched nothing in the 0 lines of stderr (its first lines: nothing): check the rule of streams "
     "entry 'stderr'"),
    (PRINTS + 'effects = "^step"\nstreams = [{ stream = "socket", effects = "x" }]', 1,
     "workload.params.streams[0].stream = 'socket': 'stdout', 'stderr' or 'file:PATH'"),
    (PRINTS + 'effects = "^step"\nstreams = [{ stream = "stderr" }]', 1, "workload.params.streams[0]: give exactly one effects rule"),
], ids=["command-not-found", "exits-before-first-effect", "rule-matches-nothing", "parser-raises", "parser-not-found",
        "fewer-effects-than-ops", "file-missing", "server-never-listens", "server-exits-first", "port-taken",
        "server-without-port", "comparison-not-found", "second-stream-matches-nothing", "second-stream-a-socket",
        "second-stream-without-rule"])
def test_a_program_that_cannot_be_judged_as_written_is_refused_before_any_trial(tmp_path, params, ops, said):
    (tmp_path / "broken.py").write_text("def make():\n    return lambda line: [(1, 1 / 0)]\n")
    out = tmp_path / "results"
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    with taken:
        proc = cli("run", str(scenario(tmp_path, params.replace("TAKEN", str(taken.getsockname()[1])), ops=ops)),
                   "--out", str(out))
    assert proc.returncode == 254, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert said in proc.stderr, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert not out.exists() or not any(out.iterdir()), "a refused program leaves no run directory"


@pytest.mark.parametrize("engine", ["docker", "podman"])
def test_a_program_s_stdout_under_a_container_engine_is_refused_naming_the_streams_it_can_be_watched_by(tmp_path, engine):
    # The engine keeps a container's stdout and stderr (its log); refused at the door, before any engine is asked.
    out = tmp_path / "results"
    proc = cli("run", str(scenario(tmp_path, PRINTS + 'effects = "^step"')), "--out", str(out),
               "--set", f'pipeline.backends=["{engine}"]')
    assert proc.returncode == 254, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert f"workload.params.stream: 'stdout' under '{engine}': the program runs in a container" in proc.stderr
    assert 'stream = "file:PATH"' in proc.stderr and "Traceback" not in proc.stderr
    assert not out.exists() or not any(out.iterdir())


def test_a_program_that_does_not_reproduce_itself_is_named_and_never_judged(tmp_path):
    params = ('command = ["python3", "-c", "import time; print(\'step 1 \' + str(time.time_ns()))"]\n'
              'effects = "^step (?P<index>\\\\d+) (?P<payload>\\\\d+)"')
    proc = cli("run", str(scenario(tmp_path, params)), "--out", str(tmp_path / "results"))
    assert proc.returncode == 254, proc.stderr[-2000:]  # nothing was tested
    assert "not deterministic on this machine: two uninterrupted runs differ at op 1 (stdout#1): effect payload" in proc.stdout + proc.stderr


def test_a_pipe_a_stray_process_keeps_open_does_not_hold_its_reader_after_the_trial(tmp_path):
    import os
    import signal

    # The program leaves behind a process of its own session that holds its stdout open (setsid): no EOF ever.
    obs = observe(tmp_path, """
        import subprocess, sys
        stray = subprocess.Popen(["setsid", "sleep", "30"])
        print(f"step 1", flush=True)
        print(stray.pid, file=sys.stderr, flush=True)
    """)
    stray = int(obs.last_words().split()[-1])
    try:
        assert [s.key for s in obs.seen] == ["stdout#1"]
        assert not any(t.is_alive() for t in obs.readers), "a reader stayed blocked on a pipe the stray holds"
    finally:
        os.kill(stray, signal.SIGKILL)


def test_cuts_land_at_a_time_and_at_a_stream_size_with_no_instrumentation(tmp_path):
    import pandas as pd

    # 40 lines of 8 bytes ("step NN\n"), one each 10 ms: op 3 of "size" is 3 x 64 = 192 bytes (line 24); op 3 of
    # "time" is 3 x 100 ms after the start. Each lands there, and the program is started again (restarted).
    path = tmp_path / "timed.toml"
    path.write_text(textwrap.dedent("""
        name = "timed"
        [workload]
        name = "program"
        [workload.params]
        command = ["python3", "-c", "import time\\nfor i in range(10, 50):\\n    print(f'step {i}', flush=True); time.sleep(0.01)"]
        effects = '^step (?P<index>\\d+)$'
        ops = 3
        cut_time_ms = 100
        cut_bytes = 64
        [pipeline]
        backends = ["restart"]
        faults = ["kill"]
        [plan]
        source = "exhaustive"
        cut_mode = "async"
        ops = [3, 3]
        phases = ["time", "size"]
        async_offset_ms = [0]
    """))
    proc = cli("run", str(path), "--out", str(tmp_path / "results"))
    assert proc.returncode in (0, 1), proc.stderr[-2000:]
    run = tmp_path / "results" / "latest"
    trials = pd.read_parquet(run / "trials.parquet").set_index("cut_phase")
    assert sorted(trials.index) == ["size", "time"] and list(trials["restarted"]) == [1, 1], trials[["outcome", "error"]]
    timeline = pd.read_parquet(run / "timeline.parquet")
    reached = timeline[timeline.stage == "reach_cut"].set_index("trial_id")
    details = {trials.loc[phase, "trial_id"]: phase for phase in ("size", "time")}
    said = {details[t]: reached.loc[t] for t in details}
    assert said["size"]["detail"] == "async +0ms after 192 bytes" and said["size"]["hwm_after"] >= 24
    assert said["time"]["detail"] == "async +0ms after 300 ms" and said["time"]["duration_s"] >= 0.29


def test_an_artefact_compared_within_its_tolerance_passes_and_one_beyond_it_is_named(tmp_path):
    import json

    import pandas as pd

    # final.txt: how many times the program was started in its directory, plus noise far below the tolerance (so
    # the two uninterrupted runs differ in bytes and still agree) and below the 6 digits a finding prints (so the
    # finding's words are the same every run). A requeue starts it a second time: 1 apart.
    (tmp_path / "cmp.py").write_text("def apart(a, b):\n    return abs(float(a.read_text()) - float(b.read_text()))\n")
    (tmp_path / "prog.py").write_text(textwrap.dedent("""
        import os, random, time
        starts = int(open("starts").read()) + 1 if os.path.exists("starts") else 1
        open("starts", "w").write(str(starts))
        for i in range(1, 6):
            print(f"step {i}", flush=True); time.sleep(0.05)
        open("final.txt", "w").write(repr(starts + random.random() * 1e-9))
    """))
    path = scenario(tmp_path, 'command = ["python3", "prog.py"]\nfiles = ["prog.py"]\neffects = "^step (?P<index>\\\\d+)"\n'
                              'artefacts = [{ path = "final.txt", compare = "cmp:apart", tolerance = 0.01 }]', ops=2)
    proc = cli("run", str(path), "--out", str(tmp_path / "results"))
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]  # judged (reproducible), and invalid
    run = (tmp_path / "results" / "latest").resolve()
    (trial,) = pd.read_parquet(run / "trials.parquet").to_dict("records")
    details = [f["detail"] for f in json.loads(trial["findings"]) if f["kind"] == "mixed_epoch"]
    assert details and "(final.txt: 1 > tolerance 0.01)" in details[0], trial["findings"]
    (kept,) = (run / "references").glob("*.artefacts")
    assert float((kept / "final.txt").read_text()) < 1.01  # the first uninterrupted run's copy, kept for resume


def test_a_requeued_program_that_ends_before_its_lines_arrive_is_judged_on_them_not_lost(tmp_path):
    import json

    import pandas as pd

    # Its second start leaves its lines to a process of its own that prints them after it exited: the requeue sees
    # it exit 0 before the effects seen at the cut are seen again. That is its end, not a lost process.
    (tmp_path / "prog.py").write_text(textwrap.dedent("""
        import os, subprocess, time
        lines = "".join(f"step {i}\\n" for i in range(1, 11))
        if os.path.exists("started"):
            open("later.txt", "w").write(lines)
            subprocess.Popen(["sh", "-c", "sleep 0.5; cat later.txt"])
        else:
            open("started", "w").close()
            for line in lines.splitlines():
                print(line, flush=True); time.sleep(0.05)
    """))
    path = scenario(tmp_path, 'command = ["python3", "prog.py"]\nfiles = ["prog.py"]\neffects = "^step (?P<index>\\\\d+)"',
                    ops=5)
    text = path.read_text().replace("ops = [1, 1]", "ops = [5, 5]")
    path.write_text(text)
    proc = cli("run", str(path), "--out", str(tmp_path / "results"))
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    (trial,) = pd.read_parquet((tmp_path / "results" / "latest").resolve() / "trials.parquet").to_dict("records")
    # (What its leftover process prints after the program's end is not waited for: the trial's processes are stopped.)
    kinds = {f["kind"] for f in json.loads(trial["findings"])}
    assert "restarted" in kinds and "process_lost" not in kinds and not trial["error"], (trial["findings"], trial["error"])
    timeline = pd.read_parquet((tmp_path / "results" / "latest").resolve() / "timeline.parquet")
    assert "the started program ran to its end" in set(timeline["detail"])


def test_a_handle_peeks_at_an_exit_and_leaves_it_for_the_handle_pointed_at_the_pid_after_it(tmp_path):
    import time

    from cutbench.procs import spawn

    # What a requeue's catch-up does: it sees the started program's exit without collecting it, so the trial's
    # handle, pointed at that pid once the cut returns (replaced_by), collects the real status, not -1.
    started = spawn(["sh", "-c", "exit 3"], cwd=str(tmp_path))
    time.sleep(0.3)
    assert started.peek() == 3 and started.peek() == 3
    trial = spawn(["true"], cwd=str(tmp_path))
    assert trial.wait(10) == 0
    trial.replaced_by(started.pid)
    assert trial.poll() == 3
