"""The ``docker`` and ``podman`` backends on real engines (marked ``criu``: must run in CI).

``make test`` installs Debian's docker.io and podman; the fixtures start the
project's own dockerd for the session and stop it after. The same plans go
through CRIU alone and through each engine: a container checkpoint is CRIU
underneath, so the verdict per plan must be the same, and a restore must
continue the execution (never ``restarted``).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd
import pytest

from cutbench.api import open_run
from cutbench.harness.provision import engines
from cutbench.harness.nemesis.backends import docker as docker_backend
from cutbench.harness.nemesis.backends.docker import RUNC_OPTIONS, _lock_options
from tests.conftest import FULL_SUITE, REPO
from tests.fixtures.run_fixtures import run_table as run

pytestmark = pytest.mark.criu


def left_behind(run_id: str) -> list[str]:
    """Trial containers either engine still holds of run ``run_id`` (by its label: another run's garbage is not ours)."""
    return [c.name for c in engines.trial_containers() if c.run == run_id]


def runc_options_left() -> bool:
    """Whether runc's CRIU options file is there while no Docker cut holds it: every cut removes it before it lets go
    of the backend's lock, so this waits for a cut in flight (another run's, on another xdist worker) and then looks."""
    lock = _lock_options()
    try:
        return RUNC_OPTIONS.exists()
    finally:
        lock.close()


def unpacked_copies_of(inventories: list[bytes]) -> set[Path]:
    """containerd's ``ctrd-checkpoint*`` directories (one per Docker restore) unpacked from the checkpoints whose
    ``inventory.img`` is among ``inventories`` (another xdist worker's cut may hold its own copy at the time)."""
    found = set()
    for path in docker_backend.unpacked_checkpoints():
        try:
            if (path / "inventory.img").read_bytes() in inventories:
                found.add(path)
        except OSError:
            continue
    return found


def latest_run(results_root: Path) -> str:
    """The run id of the newest run under ``results_root``."""
    return (results_root / "latest").resolve().name


# The quick scenario's cut points at op 3's publish by default (the other engine tests cut at commit), at all seven
# phases with CUTBENCH_FULL_SUITE=1.
QUICK_PHASES = [] if FULL_SUITE else ["--set", 'plan.phases=["publish"]']


def test_docker_and_podman_give_criu_s_verdict_on_every_quick_plan_and_continue_the_run(
        criu, docker_engine, podman_engine, results_root):
    trials = run(results_root, "quick.toml", "--set", 'pipeline.backends=["criu", "docker", "podman"]', *QUICK_PHASES,
                 "--jobs", "4")
    assert len(trials) == (84 if FULL_SUITE else 12) and (trials["outcome"] != "unknown").all(), trials[trials["outcome"] == "unknown"][["arm", "error"]]
    key = ["receiver_mode", "fault", "cut_op", "cut_phase"]
    by_backend = {b: t.set_index(key)["outcome"].sort_index() for b, t in trials.groupby("backend")}
    for engine in ("docker", "podman"):
        assert by_backend[engine].equals(by_backend["criu"]), pd.concat([by_backend["criu"], by_backend[engine]], axis=1)
        t = trials[trials["backend"] == engine]
        # Each restore continued the execution: one restore per trial, never a fresh start.
        assert (t["restores"] == 1).all() and (t["restarted"] == 0).all()
        assert (t[f"{engine}_checkpoint_s"] > 0).all() and (t[f"{engine}_restore_s"] > 0).all()
        assert (t["image_bytes"] > 0).all()
    # The pattern the scenario documents: duplicates only where the original ran on and the receiver repeats them.
    invalid = trials[trials["outcome"] == "invalid"]
    assert set(zip(invalid["receiver_mode"], invalid["fault"])) == {("at_least_once", "leave_running")}
    assert left_behind(latest_run(results_root)) == [] and not runc_options_left()


def test_docker_and_podman_run_every_workload_of_the_ci_subset_to_a_verdict(criu, docker_engine, podman_engine, results_root):
    # Each workload through each engine's three paths (no fault, kill and restore, leave running and roll back) under
    # the idempotent receiver in CI; both receiver modes with CUTBENCH_FULL_SUITE=1 (the quick-plan test above holds
    # the engines to CRIU's verdicts in both). In CI, one workload of each shape the engines must carry: state in
    # the image, on disk, in a shared file, a host callback thread, a process tree, one process of a tree (the
    # rest are the same processes to runc and CRIU; every one of them with CUTBENCH_FULL_SUITE=1).
    modes = [] if FULL_SUITE else ["--set", 'receiver.modes=["idempotent"]']
    variants = [] if FULL_SUITE else [x for v in ("counter", "request_service/external-queue", "allocator_churn/shared-table",
                                                  "stream_callbacks", "ranks/tree", "ranks/one-rank") for x in ("--variant", v)]
    # The engines' checkpoints beside the suite's other workers on a 2-core machine: a stage may take longer than
    # the scenario's 30 s (a podman checkpoint timed out once), which is the harness's limit, not the engine's.
    trials = run(results_root, "all-workloads.toml", "--set", "plan.source=random", "--set", "plan.trials=1",
                 "--set", 'pipeline.backends=["docker", "podman"]', *modes, "--jobs", "4",
                 "--set", "run.stage_timeout_s=90", "--set", "run.trial_timeout_s=180", *variants)
    assert len(trials) and (trials["status"] != "unknown").all(), trials[trials["status"] == "unknown"][["variant", "arm", "error"]]
    control = trials[(trials["fault"] == "none") & (trials["receiver_mode"] == "idempotent")]
    assert (control["outcome"] != "invalid").all(), control[control["outcome"] == "invalid"][["variant", "arm", "findings"]]
    # A cut of one rank of a multi-process workload: the engines checkpoint whole containers only.
    refused = trials[trials["outcome"] == "refused"]
    assert set(refused["variant"]) <= {"ranks/one-rank"}, refused[["variant", "arm", "error"]]
    assert refused["error"].str.contains("whole containers only").all()
    assert (trials["restarted"] == 0).all()
    # Idempotent receivers hide the duplicates of in-process rollback (test_workloads runs at_least_once in CI).
    idem = trials[(trials["receiver_mode"] == "idempotent") & (trials["fault"] != "none")]
    assert len(idem) and (idem["duplicate"] == 0).all(), idem[idem["duplicate"] > 0][["variant", "arm", "findings"]]
    assert left_behind(latest_run(results_root)) == []


def test_a_streaming_server_as_it_is_in_a_container_gets_criu_s_verdict_through_each_engine(
        criu, docker_engine, podman_engine, results_root):
    # A program that knows nothing of cutbench (examples/programs/server), started by the engine in a container, its
    # effects what cutbench's clients receive over the host's network; the same cuts through CRIU on the bare process.
    # 48 requests, 4 at a time (about 6 s of streams, the cut at 0.2 s): an engine returns from its leave_running
    # checkpoint in about 1 s on an idle host and in three or more beside the suite's other worker, and the crash
    # after it must still find streams in flight.
    trials = run(results_root, str(REPO / "examples" / "programs" / "server" / "containers.toml"), "--variant", "give_up",
                 "--set", "run.stage_timeout_s=90",
                 "--set", 'workload.params.http={ requests = 48, concurrency = 4, retry = "give_up" }')
    assert len(trials) == 6 and (trials["outcome"] != "unknown").all(), trials[["backend", "fault", "error"]].to_string()
    kinds = {(r["backend"], r["fault"]): {f["kind"] for f in json.loads(r["findings"] or "[]")} for r in trials.to_dict("records")}
    for backend in ("criu", "docker", "podman"):
        # kill: the clients' connections come back established, every token once (a connection still waiting to be
        # accepted at the cut is left out of the image, --skip-in-flight, and its client gives up: missing).
        assert kinds[(backend, "kill")] <= {"missing"}, trials[["backend", "fault", "findings"]].to_string()
        # leave_running: the streams in flight break (restored closed) and the clients give up on them.
        assert kinds[(backend, "leave_running")] == {"missing"}, trials[["backend", "fault", "findings"]].to_string()
    engines_ = trials[trials["backend"] != "criu"]
    # Each engine restored the container it checkpointed: the program went on, never started again.
    assert (engines_["restores"] == 1).all() and (engines_["restarted"] == 0).all()
    assert left_behind(latest_run(results_root)) == []


@pytest.mark.parametrize("scenario, extra, leave_running", [
    # GROMACS's md.log (a file in the trial's directory, which the container mounts): md.log grew after the dump, and
    # CRIU under each engine refuses to restore a file of another size, as on the bare process. The cut at op 10 of
    # 121 (the scenario's is at 60): the run takes about 2 s, and an engine's checkpoint that comes after its end
    # (0.4 s on an idle host, seconds beside the suite's other worker) is no verdict.
    ("gromacs/gromacs.toml", ["--set", 'receiver.modes=["idempotent"]', "--set", "plan.ops=[10, 10]"],
     "criu restore|criu failed"),
    # The ticker's TCP connection to its collector (a socket cutbench listens on): restored closed after leave_running,
    # and the ticker's next send fails, in its own words (the engine's log of the container).
    ("ticker/carbon.toml", [], "BrokenPipeError"),
], ids=["gromacs-md-log", "ticker-socket"])
def test_a_program_s_file_and_socket_streams_in_a_container_get_criu_s_verdict(
        criu, docker_engine, podman_engine, results_root, request, scenario, extra, leave_running):
    if scenario.startswith("gromacs"):
        request.getfixturevalue("gromacs")
    started = datetime.now(timezone.utc)
    trials = run(results_root, str(REPO / "examples" / "programs" / scenario), *extra, "--set", "run.stage_timeout_s=90",
                 "--set", 'pipeline.backends=["criu", "docker", "podman"]')
    assert len(trials) == 6 and (trials["outcome"] != "unknown").all(), trials[["backend", "fault", "error"]].to_string()
    by = {(r["backend"], r["fault"]): r for r in trials.to_dict("records")}
    for backend in ("criu", "docker", "podman"):
        # kill: every effect once, and the final artefacts equal the uninterrupted runs' (GROMACS's md.gro).
        assert by[(backend, "kill")]["outcome"] == "valid", by[(backend, "kill")]["findings"]
        lost = by[(backend, "leave_running")]
        kinds = {f["kind"] for f in json.loads(lost["findings"])}
        if backend == "docker" and kinds == {"deadlock"} and engine_lost_a_restored_task(started, restored_pids(results_root, lost)):
            continue  # the engine's own defect, in its own words (docs/containers.md): a stall is the right verdict
        assert kinds == {"process_lost"}, lost["findings"]
        assert re.search(leave_running, lost["error"]), lost["error"]
    assert left_behind(latest_run(results_root)) == []


def restored_pids(results_root: Path, trial: dict) -> set[int]:
    """The host pids an engine's restores of ``trial`` (a row of the newest run's trials table) gave back, as its
    timeline says."""
    timeline = open_run(results_root / "latest").timeline_of(trial["trial_id"])
    details = timeline.loc[timeline["stage"].str.endswith("_restore"), "detail"]
    return {int(d.split()[1]) for d in details if str(d).startswith("pid ")}


def engine_lost_a_restored_task(since: datetime, pids: set[int]) -> list[str]:
    """The project's dockerd's own words, logged after ``since``, that containerd found the cgroup of a task it
    restored as one of ``pids`` deleted: that container reports running, never runs again, and outlives a kill."""
    try:
        lines = engines.docker_paths().log.read_text(errors="replace").splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        stamp = re.match(r'time="([^"]+)"', line)  # RFC 3339 with its zone (Z or an offset), nanoseconds
        said = re.search(r'"loading cgroup for (\d+)".*cgroup deleted', line)
        if stamp and said and int(said.group(1)) in pids:
            when = datetime.fromisoformat(re.sub(r"(\.\d{6})\d+", r"\1", stamp.group(1)).replace("Z", "+00:00"))
            if when >= since:
                found.append(line)
    return found


SHELL_IMAGE = "cutbench-test-shell:1"
# The program exits 3 where it finds a /usr: in its own image there is none, in cutbench's image the host's is mounted.
NO_USR = "[ -e /usr ] && exit 3;"
SHELL_PROGRAM = """
name = "shell-in-its-image"
[workload]
name = "program"
[workload.params]
image = "IMAGE"
command = ["sh", "-c", "NO_USR i=0; while [ $i -lt 40 ]; do i=$((i+1)); echo step $i >> steps.log; j=0; \
  while [ $j -lt 20000 ]; do j=$((j+1)); done; done; echo $i > result.txt"]
stream = "file:steps.log"
effects = '^step (?P<index>\\d+)$'
ops = 40
artefacts = ["result.txt"]
[pipeline]
backends = ["docker", "podman"]
faults = ["kill", "leave_running"]
crash_after_ms = [100]
[plan]
source = "exhaustive"
cut_mode = "async"
ops = [10, 10]
phases = ["effect"]
[run]
watchdog_s = 15
trial_timeout_s = 60
stage_timeout_s = 90
""".replace("NO_USR", NO_USR)


def shell_rootfs() -> bytes:
    """A root filesystem that owes the host nothing at run time: Debian's dash as /bin/sh and the two libraries it
    loads, copied in (what a user's own small image is, without a registry)."""
    import io
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name in ("tmp", "proc", "dev", "sys", "etc", "bin", "lib", "lib/x86_64-linux-gnu", "lib64"):
            info = tarfile.TarInfo(name)
            info.type, info.mode = tarfile.DIRTYPE, 0o1777 if name == "tmp" else 0o755
            tar.addfile(info)
        for source, target in (("/usr/bin/dash", "bin/sh"),
                               ("/lib/x86_64-linux-gnu/libc.so.6", "lib/x86_64-linux-gnu/libc.so.6"),
                               ("/lib64/ld-linux-x86-64.so.2", "lib64/ld-linux-x86-64.so.2")):
            tar.add(os.path.realpath(source), arcname=target)
    return buf.getvalue()


@pytest.fixture
def shell_image(docker_engine, podman_engine):
    """:data:`SHELL_IMAGE` imported into both engines for the test, and removed after it."""
    from cutbench.harness.nemesis.backends.podman import PodmanCheckpointer

    tar = shell_rootfs()
    docker, podman = docker_backend.DockerCheckpointer(), PodmanCheckpointer()
    repository, tag = SHELL_IMAGE.split(":")
    docker.api.import_image_from_data(tar, repository=repository, tag=tag)
    assert podman.podman("import", "-", SHELL_IMAGE, stdin=tar).returncode == 0
    try:
        yield SHELL_IMAGE
    finally:
        docker.api.remove_image(SHELL_IMAGE, force=True)
        podman.podman("rmi", "-f", SHELL_IMAGE)


def test_a_program_in_its_own_image_is_recorded_and_cut_there_through_each_engine(criu, shell_image, results_root, tmp_path):
    # Its command is the image's (sh: nothing of the host's /usr; it exits 3 where it finds a /usr, so a run in
    # cutbench's own image would match no effect); its uninterrupted runs run in the image too. It
    # paces itself by counting, not with sleep: a process forked at each step is, now and then, one CRIU cannot
    # seize ("Unseizable non-zombie … state D": a refused dump, the tool's answer, but not this test's subject).
    scenario = tmp_path / "shell.toml"
    scenario.write_text(SHELL_PROGRAM.replace("IMAGE", shell_image))
    trials = run(results_root, str(scenario))
    assert len(trials) == 4 and (trials["outcome"] != "unknown").all(), trials[["backend", "fault", "error"]].to_string()
    by = {(r["backend"], r["fault"]): r for r in trials.to_dict("records")}
    for engine in ("docker", "podman"):
        # kill: the restored shell goes on from the dump, every step once, result.txt equal.
        assert by[(engine, "kill")]["outcome"] == "valid", by[(engine, "kill")]["findings"]
        # leave_running: the original appended more steps after the dump (the log is opened per line, so CRIU has
        # no open file to refuse); the restored copy appends them again.
        kinds = {f["kind"] for f in json.loads(by[(engine, "leave_running")]["findings"])}
        assert kinds == {"duplicate"}, by[(engine, "leave_running")]["findings"]
    assert left_behind(latest_run(results_root)) == []


def test_a_program_s_own_image_the_engine_lacks_or_under_a_tool_with_no_container_is_refused_naming_it(
        criu, docker_engine, podman_engine, tmp_path):
    from tests.fixtures.run_fixtures import cli

    scenario = tmp_path / "shell.toml"
    scenario.write_text(SHELL_PROGRAM.replace("IMAGE", "cutbench-no-such-image:0"))
    for backend, said in (("docker", "workload.params.image = 'cutbench-no-such-image:0': docker holds no such image"),
                          ("podman", "workload.params.image = 'cutbench-no-such-image:0': podman holds no such image"),
                          ("criu", "a program in its own image runs under a container engine (docker, podman); "
                                   "pipeline.backends has 'criu'")):
        out = tmp_path / f"results-{backend}"
        proc = cli("run", str(scenario), "--out", str(out), "--set", f'pipeline.backends=["{backend}"]')
        assert proc.returncode == 254 and said in proc.stderr, proc.stderr[-2000:]
        assert not out.exists() or not any(out.iterdir())


# A program whose helper calls setsid and outlives its parent by a moment (tests/fixtures/setsid_helper.py).
SETSID_PROGRAM = """
name = "setsid-helper"
[workload]
name = "program"
[workload.params]
command = ["python3", "setsid_helper.py", "--steps", "40", "--interval-ms", "20"]
files = ["HELPER"]
stream = "file:steps.log"
effects = '^step (?P<index>\\d+) (?P<payload>\\w+)$'
ops = 40
artefacts = ["result.txt"]
[pipeline]
backends = ["criu", "docker", "podman"]
faults = ["kill", "leave_running"]
crash_after_ms = [100]
[plan]
source = "exhaustive"
cut_mode = "async"
ops = [10, 10]
phases = ["effect"]
[run]
watchdog_s = 15
trial_timeout_s = 60
stage_timeout_s = 90
""".replace("HELPER", str(REPO / "tests" / "fixtures" / "setsid_helper.py"))


def test_a_program_whose_helper_leaves_its_process_group_is_restored_by_each_tool(
        criu, docker_engine, podman_engine, results_root, tmp_path):
    # The helper is in a session of its own and outlives a kill of its parent's group by 1.3 s: CRIU restores every
    # pid of the tree it dumped, and one still held failed each restore ("Can't fork for PID: File exists"), which
    # was blamed on CRIU (process_lost). The harness takes the whole tree down before a restore, whatever its groups.
    scenario = tmp_path / "setsid.toml"
    scenario.write_text(SETSID_PROGRAM)
    trials = run(results_root, str(scenario))
    assert len(trials) == 6 and (trials["outcome"] != "unknown").all(), trials[["backend", "fault", "error"]].to_string()
    by = {(r["backend"], r["fault"]): r for r in trials.to_dict("records")}
    for backend in ("criu", "docker", "podman"):
        # kill: restored, every step once and result.txt equal.
        assert by[(backend, "kill")]["outcome"] == "valid", by[(backend, "kill")]["error"]
        # leave_running: the original appended steps after the dump, the restored copy appends them again.
        kinds = {f["kind"] for f in json.loads(by[(backend, "leave_running")]["findings"])}
        assert kinds == {"duplicate"}, by[(backend, "leave_running")]["error"]
    # No helper outlives its trial, whichever session it is in.
    left = subprocess.run(["pgrep", "-f", "setsid_helper.py"], capture_output=True, text=True).stdout.split()
    assert left == [] and left_behind(latest_run(results_root)) == []


def test_a_scenario_s_criu_options_reach_the_criu_each_engine_runs(criu, docker_engine, podman_engine, results_root):
    # The SQLite worker (examples/programs/jobs) announcing to a file it appends to: its database's lock is dumped
    # only with --file-locks, through runc's CRIU as through CRIU alone.
    jobs = REPO / "examples" / "programs" / "jobs" / "jobs.toml"
    trials = run(results_root, str(jobs), "--set", 'pipeline.backends=["docker", "podman"]',  # criu: test_programs
                 "--set", 'receiver.modes=["idempotent"]', "--set", 'workload.params.stream="file:announce.log"',
                 "--set", 'workload.params.command=["python3", "worker.py", "--jobs", "40", "--interval-ms", "20", '
                          '"--announce", "announce.log"]', "--set", "run.stage_timeout_s=90")
    assert len(trials) == 4, trials[["arm", "outcome", "error"]].to_string()
    for row in trials.to_dict("records"):
        if row["criu_options"]:
            assert row["outcome"] == "valid", (row["arm"], row["error"])
        else:
            assert row["outcome"] == "refused" and "--file-locks" in row["error"], (row["arm"], row["error"])
    assert left_behind(latest_run(results_root)) == [] and not runc_options_left()


def test_a_program_in_a_container_is_not_cut_at_its_system_calls_and_says_why(criu, docker_engine, podman_engine,
                                                                              tmp_path):
    # The engine's CRIU freezes the container's cgroup, and with the program held stopped at its call the
    # checkpoint never returned (measured with both engines): refused before any trial, naming what works.
    from tests.fixtures.run_fixtures import cli

    for engine in ("docker", "podman"):
        proc = cli("run", str(REPO / "examples" / "programs" / "jobs" / "syscalls.toml"), "--out", str(tmp_path),
                   "--variant", "announce-commit", "--set", f'pipeline.backends=["{engine}"]',
                   "--set", 'workload.params.stream="file:announce.log"')
        assert proc.returncode == 254, proc.stderr[-2000:]
        assert f"plan.phases has \"syscall\" under '{engine}': a container engine's checkpoint freezes" in proc.stderr


@pytest.mark.parametrize("engine", ["docker", "podman"])
def test_several_restores_of_one_container_in_one_trial(criu, docker_engine, podman_engine, results_root, engine):
    """Periodic checkpoints: the restored container is cut, killed and restored again, twice more."""
    trials = run(results_root, "quick.toml", "--set", f'pipeline.backends=["{engine}"]', "--set", 'pipeline.faults=["kill"]',
                 "--set", 'receiver.modes=["at_least_once"]', "--set", "plan.source=periodic", "--set", "plan.ops=[2, 6]",
                 "--set", "plan.interval_ops=2", "--set", "plan.trials=1", "--set", 'plan.phases=["commit"]')
    [row] = trials.itertuples()
    assert row.outcome == "valid" and row.n_cuts == 3 and row.restores == 3, (row.outcome, row.error)


def test_a_docker_restore_right_after_its_checkpoint_is_measured_not_refused_by_containerd_s_leftover(
        criu, docker_engine, tmp_path):
    """Docker tars the checkpoint back into containerd's store on restore, and refuses while the checkpoint's own
    blob is still there (moby/moby#42900): right after the checkpoint it nearly always is. Three cuts in a row,
    each restored at once: the backend's one retry gets every restore through, and says so in ``harness_action``.
    The copy of each checkpoint that containerd unpacks for its restore (and never removes) is gone after the cut."""
    from cutbench.harness.model.plan import Cut
    from cutbench.harness.model.timeline import Timeline
    from cutbench.harness.nemesis.backends.docker import DockerCheckpointer
    from cutbench.harness.nemesis.base import CutContext

    backend = DockerCheckpointer()
    inventories: list[bytes] = []
    child = backend.launch([sys.executable, "-c", "import time\nwhile True: time.sleep(0.05)"], cwd=str(tmp_path))
    actions = []
    try:
        time.sleep(0.5)  # the interpreter is up
        for i in range(3):
            ctx = CutContext(images_dir=tmp_path / f"c{i}", timeline=Timeline("t0"), cut_index=i,
                             cut=Cut(op=1, phase="admit", fault="kill"), stage_timeout_s=60)
            try:
                backend.checkpoint(child, ctx)
                inventories.append((backend._checkpoint_dir(*backend._cuts[ctx.images_dir]) / "inventory.img").read_bytes())
                child.replaced_by(backend.restore(ctx))
                assert child.alive()
                actions.append(ctx.facts.get("harness_action", ""))
            finally:
                backend.cleanup(ctx)
    finally:
        child.kill_groups()
    assert all(a == "" or "moby/moby#42900" in a for a in actions), actions
    assert len(inventories) == 3 and unpacked_copies_of(inventories) == set()
    print("restores that needed the retry:", sum(bool(a) for a in actions), "of 3")


def test_podman_reports_its_own_statistics_as_facts(criu, podman_engine, results_root):
    run(results_root, "quick.toml", "--set", 'pipeline.backends=["podman"]', "--set", 'pipeline.faults=["kill"]',
        "--set", 'receiver.modes=["idempotent"]', "--set", 'plan.phases=["commit"]')
    record = json.loads(next(((results_root / "latest").resolve() / "trials").glob("*.json")).read_text())
    facts = record["record"]["facts"]
    for fact in ("podman_checkpoint_total_s", "podman_criu_frozen_s", "podman_restore_total_s", "podman_criu_restore_s"):
        assert facts[fact] > 0, facts


def test_engine_cli_reports_and_starts_the_project_s_dockerd(docker_engine):
    out = subprocess.run([sys.executable, "-m", "cutbench", "engine", "start", "docker"], capture_output=True, text=True,
                         cwd=REPO, timeout=120)
    said = out.stdout + out.stderr  # messages for people go to stderr, as for every command
    assert out.returncode == 0 and "already running" in said and "experimental on" in said, said
    status = subprocess.run([sys.executable, "-m", "cutbench", "engine", "status"], capture_output=True, text=True,
                            cwd=REPO, timeout=60)
    said = status.stdout + status.stderr
    assert "docker: 20." in said and "experimental on" in said and "podman: " in said, said


def test_a_runc_options_file_of_someone_else_makes_the_docker_backend_unavailable(docker_engine, tmp_path, monkeypatch):
    from cutbench.harness.nemesis.backends import docker

    if runc_options_left():
        pytest.fail(f"{RUNC_OPTIONS} exists with no cut running: a run left it behind")
    # The backend's options path moved into this test's directory: the other tests' Docker runs (other xdist
    # workers) go on with the real one, which a foreign file there would make unavailable to them too.
    options = tmp_path / "criu" / RUNC_OPTIONS.name
    monkeypatch.setattr(docker, "RUNC_OPTIONS", options)
    options.parent.mkdir()
    options.write_text("tcp-established\n")
    try:
        reason = docker.DockerCheckpointer().unavailable_reason()
    finally:
        options.unlink()
    assert reason and str(options) in reason and "move that file away" in reason
    assert docker.DockerCheckpointer().unavailable_reason() is None


SLOW = """
name = "slow-container"
[workload]
name = "counter"
array = "numpy"
params = { ops = 40, state_size = 1024, seed = 3, op_interval_ms = 250.0 }
[receiver]
modes = ["idempotent"]
[pipeline]
backends = ["ENGINE"]
faults = ["kill"]
[plan]
source = "exhaustive"
ops = [30, 30]
phases = ["commit"]
"""


def start_and_wait_for_container(engine: str, tmp_path: Path) -> tuple[subprocess.Popen, str]:
    """``cutbench run`` of a slow counter in a container, returned once the trial's container runs (and its run id)."""
    scenario = tmp_path / "slow.toml"
    scenario.write_text(SLOW.replace("ENGINE", engine))
    out = tmp_path / "results"
    proc = subprocess.Popen([sys.executable, "-m", "cutbench", "run", str(scenario), "--out", str(out)], cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        runs = [p.name for p in out.glob("*-slow-container-*")] if out.is_dir() else []
        if runs and any(c.running for c in engines.trial_containers() if c.run == runs[0]):
            return proc, runs[0]
        if proc.poll() is not None:
            pytest.fail(f"the run ended before its container ran: {proc.stderr.read().decode()[-2000:]}")
        time.sleep(0.3)
    proc.kill()
    pytest.fail("no container of the run appeared within 120 s")


@pytest.mark.parametrize("engine", ["docker", "podman"])
def test_a_run_stopped_by_sigterm_removes_its_container(criu, docker_engine, podman_engine, tmp_path, engine):
    proc, run_id = start_and_wait_for_container(engine, tmp_path)
    proc.send_signal(signal.SIGTERM)
    code = proc.wait(timeout=120)
    said = proc.stderr.read().decode()
    assert code == 128 + signal.SIGTERM, (code, said[-6000:])
    assert left_behind(run_id) == []
    assert not list(Path("/dev/shm").glob(f"cutbench-{run_id}-*"))


# alone: any run's sweep removes a container whose harness is gone; this test asserts that its own next run did.
@pytest.mark.alone
@pytest.mark.parametrize("engine", ["docker", "podman"])
def test_what_a_sigkilled_run_left_is_removed_when_the_next_run_starts(criu, docker_engine, podman_engine, tmp_path,
                                                                        engine):
    proc, run_id = start_and_wait_for_container(engine, tmp_path)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert left_behind(run_id), "a SIGKILLed harness removes nothing (the test's premise)"
    status = subprocess.run([sys.executable, "-m", "cutbench", "engine", "status"], capture_output=True, text=True,
                            cwd=REPO, timeout=120)
    assert f"run {run_id}, harness gone" in status.stdout + status.stderr
    nxt = subprocess.run([sys.executable, "-m", "cutbench", "run", str(REPO / "scenarios" / "quick.toml"),
                          "--set", 'plan.phases=["commit"]', "--set", 'pipeline.faults=["kill"]',
                          "--set", 'receiver.modes=["idempotent"]', "--out", str(tmp_path / "next")],
                         capture_output=True, text=True, cwd=REPO, timeout=300)
    assert nxt.returncode == 0, nxt.stderr[-2000:]
    assert "container" in nxt.stderr and run_id in nxt.stderr  # it says what it removed
    assert left_behind(run_id) == []
    assert not (Path(os.environ.get("CUTBENCH_RUNS_DIR", "/var/tmp/cutbench/runs")) / f"{run_id}.json").exists()


@pytest.mark.parametrize("engine", ["docker", "podman"])
def test_a_workload_that_dies_before_its_log_says_why_in_its_error(criu, docker_engine, podman_engine, tmp_path, engine):
    """The container's own output (kept by the engine) is the error's last words: here an import that fails."""
    scenario = tmp_path / "refusal.toml"
    scenario.write_text(SLOW.replace("ENGINE", engine).replace('name = "counter"', 'name = "tests.fixtures.container_refusal:HostOnlyCounter"')
                        .replace("ops = [30, 30]", "ops = [2, 2]"))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-m", "cutbench", "run", str(scenario), "--out", str(tmp_path / "r"), "--json"],
                         capture_output=True, text=True, cwd=REPO, timeout=300, env=env)
    assert out.returncode == 2, out.stderr[-2000:]  # unknown only: the harness could not judge
    record = json.loads(((tmp_path / "r" / "latest").resolve() / "trials" / "t0001.json").read_text())["record"]
    assert record["error"].startswith("workload exited (1) before cut 0")
    assert "this workload module refuses to load inside a container" in record["error"]
    assert "refuses to load inside a container" in record["log_tail"]
    assert left_behind((tmp_path / "r" / "latest").resolve().name) == []
