"""What a run refuses before anything runs: arms this machine cannot run, programs that cannot start, workloads a
trial's process cannot import, storage that is unwritable or nearly full.

Each check raises one clear error (:class:`~cutbench.errors.InvalidArgument` for the user's input,
:class:`~cutbench.errors.Unavailable` for what this machine lacks) naming what to fix, so that a run that cannot
be carried out stops at once, never as a run of refused or ``unknown`` trials blamed on a tool.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

from cutbench import storage
from cutbench.errors import InvalidArgument, Unavailable, WorkloadError
from cutbench.harness.nemesis import Backends
from cutbench.harness.model.scenario import Arm, Scenario
from cutbench.harness.nemesis.base import optional
from cutbench.workloads import api as workload_api
from cutbench.workloads import program as program_api


def check_backends(scenario: Scenario, backends: Backends | None = None) -> tuple[list[Arm], list[dict[str, str]]]:
    """Split the scenario's arms into runnable ones and skipped ones (with the reason); ``backends``: the run's
    (a fresh :class:`Backends` when it has none).

    Raises :class:`Unavailable` when a backend cannot run and the scenario does
    not allow skipping (``pipeline.skip_unavailable``); :class:`InvalidArgument`, on any machine, for a
    program that cannot run under a backend as its scenario says (:func:`_check_program_under`), and for a
    program's own image that an engine here does not hold.
    """
    backends = backends or Backends()
    reasons: dict[str, str | None] = {}
    faults: dict[str, frozenset[str] | None] = {}
    program = bool(workload_api.optional(scenario.workload_class(), "program"))
    image = scenario.params["image"] if program else ""
    for name in scenario.backends:
        try:
            backend = backends.new(name)
            if program:
                _check_program_under(scenario, name, backend)  # the scenario's error, said on any machine
            elif optional(backend, "output_files"):
                raise InvalidArgument(f"pipeline.backends: {name!r} runs a program as a batch job "
                                      "(workload.name = \"program\"; docs/slurm.md), not a workload class")
            reasons[name] = backend.unavailable_reason()
            check = optional(backend, "check_program")
            if program and check is not None and reasons[name] is None:
                check(scenario.params)  # what only the tool can say: a partition its cluster does not have
            has_image = optional(backend, "has_image")
            if image and reasons[name] is None and has_image is not None and not has_image(image):
                raise InvalidArgument(f"workload.params.image = {image!r}: {name} holds no such image (no pull is "
                                      f"tried); fix: load or build it into {name} first ({name} images lists them)")
            faults[name] = backend.capabilities.faults
        except Unavailable as exc:
            reasons[name] = str(exc)
            faults[name] = None
    # A workload that needs what this machine lacks (a GPU) skips every arm.
    workload_reason = workload_api.unavailable_reason(scenario.workload_class(), scenario.array)
    runnable, skipped = [], []
    for arm in scenario.arms():
        reason = workload_reason or reasons[arm.backend]
        offered = faults[arm.backend]
        if offered is not None and arm.fault not in offered:
            # Not a failure: e.g. the in-place `cuda` backend has no CPU image to restore after a kill.
            skipped.append({"arm": arm.label(), "reason": f"backend {arm.backend!r} does not support fault {arm.fault!r}"})
            continue
        if reason is None:
            runnable.append(arm)
        elif scenario.skip_unavailable:
            skipped.append({"arm": arm.label(), "reason": reason})
        elif workload_reason:
            raise Unavailable(f"workload {scenario.workload!r} cannot run here: {reason}")
        else:
            raise Unavailable(f"backend {arm.backend!r} cannot run here: {reason}")
    return runnable, skipped


def _check_program_under(scenario: Scenario, name: str, backend: Any) -> None:
    """Refuse a program that cannot run under backend ``name`` as its scenario says: one in its own image
    (``image``) under a backend that starts no container, or one watched through a pipe under a container
    engine, which keeps a container's stdout and stderr (its log) where nothing here could read them as they
    come. Raises :class:`InvalidArgument` naming the parameter and what works."""
    engine = optional(backend, "launch") is not None
    # A batch system's launch (slurm) keeps the program's stdout and stderr in files the observer reads.
    output_files = bool(optional(backend, "output_files"))
    if output_files and not scenario.params["slurm"]:
        raise InvalidArgument(f"workload.params.slurm: {name!r} runs the program as a batch job through a job script; "
                              "give at least the script, e.g. slurm = { script = \"requeue-resume.sh\" } (docs/slurm.md)")
    if output_files and scenario.params["image"]:
        raise InvalidArgument(f"workload.params.image: {name!r} runs the program as a batch job on the cluster's "
                              "node, in no image; drop the image or use docker or podman")
    if output_files and scenario.params.get("syscalls"):
        raise InvalidArgument(f"plan.phases has \"syscall\" under {name!r}: the program runs as a batch job that "
                              "cutbench does not start, so none of its calls can be held; cut it at effects "
                              "(plan.phases = [\"effect\"])")
    if engine and scenario.params.get("syscalls"):
        # Measured with Docker 20.10 and Podman 4.3 (runc, cgroup v1): the engine's CRIU freezes the container's
        # cgroup, and with the program stopped at its call in it the checkpoint never returned (docs/programs.md).
        raise InvalidArgument(f"plan.phases has \"syscall\" under {name!r}: a container engine's checkpoint freezes "
                              "the container's cgroup, and a program held stopped at a system call in it is never "
                              "checkpointed (the engine's call hangs); cut it at its system calls under criu, or in "
                              "its container at effects (plan.phases = [\"effect\"])")
    if scenario.params.get("syscalls") and (why := optional(backend, "held_calls")):
        raise InvalidArgument(f"plan.phases has \"syscall\" under {name!r}: {why}")
    image = scenario.params["image"]
    if image and not engine:
        raise InvalidArgument(f"workload.params.image = {image!r}: a program in its own image runs under a container "
                              f"engine (docker, podman); pipeline.backends has {name!r}")
    piped = [s for s in program_api.Program.watched(scenario.params) if s in program_api.PIPES]
    if engine and piped and not output_files:
        where = "workload.params.stream" if scenario.params["stream"] in piped else "workload.params.streams"
        raise InvalidArgument(f"{where}: {piped[0]!r} under {name!r}: the program runs in a container whose stdout "
                              "and stderr its engine keeps; watch a file it appends to (stream = \"file:PATH\"), a "
                              "socket (\"socket\") or its server (\"http\") (docs/programs.md)")


def check_programs(workloads: list[tuple[type, dict[str, Any]]]) -> None:
    """Refuse, before anything runs, a program workload (``(class, params)``) that cannot be started as
    its scenario says (:func:`check_program`: its command not found, a file
    missing, a parser that cannot be made). Raises :class:`InvalidArgument` naming it."""
    checked: set[str] = set()
    for workload, params in workloads:
        if not workload_api.optional(workload, "program"):
            continue
        key = json.dumps(params, sort_keys=True, default=str)
        if key not in checked:
            checked.add(key)
            try:
                check_program(params)
            except workload_api.WorkloadError as exc:
                raise InvalidArgument(str(exc)) from None


def check_tracing(workloads: list[tuple[type, dict[str, Any]]]) -> None:
    """Refuse, before anything runs, cuts at a program's system calls (``workload.params.syscalls``, from
    ``plan.phases`` with "syscall") on a machine that cannot trace one: :class:`Unavailable` with the reason and
    the fix (:func:`cutbench.harness.observer.syscalls.unavailable_reason`, tried once)."""
    if not any(workload_api.optional(w, "program") and params.get("syscalls") for w, params in workloads):
        return
    from cutbench.harness.observer.syscalls import unavailable_reason

    why = unavailable_reason()
    if why:
        raise Unavailable(f"plan.phases has \"syscall\", but this machine cannot trace a program's system calls: {why}")


def check_importable(workloads: list[tuple[str, tuple[str, ...]]]) -> None:
    """Refuse, before anything runs, a workload (``(name, workload_path)`` pairs) that a workload process cannot import.

    The harness imported every workload already, but from its own working directory and ``sys.path``; a
    trial's process starts in the trial's directory with the spec's ``workload_path``. A workload that is
    not cutbench's own is imported once there (``python -m cutbench.workloads.launch --check``), so that an
    import error is one clear refusal, not a run of ``unknown`` trials. Raises :class:`InvalidArgument` with
    the command and its stderr.
    """
    import subprocess
    import sys
    import tempfile

    from cutbench.procs import package_env

    for name, path in dict.fromkeys(workloads):
        if name in workload_api.WORKLOADS.builtin:
            continue
        argv = [sys.executable, "-m", "cutbench.workloads.launch", "--check", name, *path]
        with tempfile.TemporaryDirectory(prefix="cutbench-check-") as cwd:
            done = subprocess.run(argv, cwd=cwd, env=package_env(), capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            tail = "\n".join(done.stderr.strip().splitlines()[-12:])
            raise InvalidArgument(f"workload {name!r}: a workload process cannot import it ({' '.join(argv)} exited "
                                  f"{done.returncode}, from a directory of its own):\n{tail}")


# The least free space a run starts with: in its images directory, about one CRIU image of the smallest
# workload (a NumPy counter's is 18 MB: results/reference/containers), and in its results directory room for
# the tables, plots and report of a small run. Larger images are caught when a stage runs out (storage.exhausted).
MIN_IMAGES_FREE = 32 << 20
MIN_RESULTS_FREE = 4 << 20


def check_storage(images_dirs: set[str], results_root: str | Path, workdir: str | Path | None = None) -> None:
    """Refuse, before anything runs, an images, results or work directory that is unwritable or nearly full:
    the harness's own storage, which must never turn into refused trials blamed on a tool. Raises
    :class:`Unavailable` naming the directory, its free space and what it needs."""
    import tempfile

    problems = [storage.room_problem(d, MIN_IMAGES_FREE, "pipeline.images_dir") for d in sorted(images_dirs)]
    problems.append(storage.room_problem(results_root, MIN_RESULTS_FREE, "the results directory"))
    # The session's work directory (trial directories, the SQLite receiver store) is made under this.
    problems.append(storage.room_problem(workdir or tempfile.gettempdir(), MIN_RESULTS_FREE, "the work directory"))
    found = [p for p in problems if p]
    if found:
        raise Unavailable("; ".join(found))


def check_program(params: dict[str, Any]) -> None:
    """Raise :class:`WorkloadError` before any trial for a program that cannot be started as the scenario says:
    its command not found, a file it starts with missing, an effects parser or an artefact comparison that
    cannot be made, the port it is given already taken."""
    if params["stream"] in (program_api.HTTP, program_api.SOCKET) and params["port"]:
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", params["port"]))
            except OSError as exc:
                raise WorkloadError(f"workload.params.port = {params['port']}: already taken on 127.0.0.1 "
                                    f"({exc.strerror}); give another, or 0 for a free one") from None
    why = program_api.Program.missing_command(params)
    if why:
        raise WorkloadError(f"workload.params.command = {params['command']!r}: {why}")
    missing = program_api.Program.missing_files(params)
    if missing:
        raise WorkloadError(f"workload.params.files: {', '.join(missing)} not found")
    script = program_api.Program.slurm_settings(params)["script"] if params["slurm"] else ""
    if script and not Path(script).is_file():
        raise WorkloadError(f"workload.params.slurm.script: {script} not found")
    for rule_params in program_api.Program.watched(params).values():
        program_api.Program.rule(rule_params)
    for artefact in program_api.Program.artefacts(params):
        if artefact.compare:
            artefact.load(params["parser_path"])
