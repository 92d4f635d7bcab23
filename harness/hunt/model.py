"""What each tool documents about a process's lifecycle: states, actions, and the documented answer to each.

``cutbench hunt`` drives a probe through sequences of :data:`ACTIONS` and
compares every answer with :func:`expect`. The world it tracks is small
(:class:`World`): the probe's state as the tool names it, and the state a
CRIU image holds, if one was taken. Every documented transition carries its
source (:data:`SOURCES`), so a finding can say what the documentation
promised. Pure data: no process is touched here.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from cutbench.errors import InvalidArgument

# The driver API reference, "CUDA Checkpointing" (group__CUDA__CHECKPOINT), and the tools' own notes.
SOURCES = {
    "lock": "CUDA driver API, cuCheckpointProcessLock: \"Process must be in the RUNNING state in order to lock. "
            "Upon successful return the process will be in the LOCKED state.\"",
    "lock-timeout": "CUDA driver API, cuCheckpointProcessLock: \"If timeoutMs is specified and the timeout is reached "
                    "the process will be left in the RUNNING state upon return.\"",
    "checkpoint": "CUDA driver API, cuCheckpointProcessCheckpoint: \"Process must be in the LOCKED state. Upon "
                  "successful return the process will be in the CHECKPOINTED state.\"",
    "restore": "CUDA driver API, cuCheckpointProcessRestore: \"Process must be in the CHECKPOINTED state. Upon "
               "successful return the process will be in the LOCKED state.\"",
    "unlock": "CUDA driver API, cuCheckpointProcessUnlock: \"Process must be in the LOCKED state. Upon successful "
              "return the process will be in the RUNNING state.\"",
    "locked-blocks": "CUDA driver API, CUprocessState: LOCKED means \"CUDA API locks are taken so further CUDA API "
                     "calls will block\" (a second thread's call returns once the process is unlocked)",
    "refusal": "CUDA driver API: a call made in the wrong state returns an error; the process keeps its state "
               "(as documented for a lock that times out)",
    "failed": "CUDA driver API, CUprocessState: FAILED means \"Application entered an uncorrectable error during "
              "the checkpoint/restore process\" (never entered from a refused call)",
    "utility": "NVIDIA/cuda-checkpoint README: the utility's --action lock|checkpoint|restore|unlock are the driver "
               "API's calls, with the driver's states (--get-state)",
    "criu-gpu": "NVIDIA/cuda-checkpoint README: CRIU dumps a CUDA process after its GPU state was checkpointed "
                "(CHECKPOINTED); a process still holding device mappings is refused by CRIU without the plugin",
    "criu-dump": "CRIU, criu dump: the tree is dumped and killed; with --leave-running it keeps running",
    "criu-restore": "CRIU, criu restore: the tree is restored with its original PIDs, so a restore fails while a "
                    "process holds the PID; one image may be restored again once it is free",
    "criu-plugin": "CRIU's CUDA plugin (plugins/cuda): criu dump of a RUNNING CUDA process locks and checkpoints "
                   "it; criu restore brings the GPU state back and unlocks it (RUNNING)",
    "restore-other-gpu": "CUDA driver API, cuCheckpointProcessRestore: \"GPU UUID pairs can be specified in args to "
                         "remap the process old GPUs onto new GPUs. The GPU to restore onto needs to have enough memory "
                         "and be of the same chip type as the old GPU.\" (then LOCKED, as any restore)",
    "restore-filled": "CUDA driver API: a restore that cannot get device memory fails (CUDA_ERROR_OUT_OF_MEMORY) and "
                      "the process stays CHECKPOINTED, to be restored once memory is free",
    "signal": "POSIX: SIGSTOP then SIGCONT leaves a process as it was",
    "fork": "POSIX: a fork (and an exec in the child) does not change the parent's state; the child makes no CUDA call",
    "kill": "POSIX: SIGKILL ends the process in any state, and the driver frees its device memory",
    "work": "the probe's own work (a step on its buffers, an allocation, a free): only while RUNNING",
    "in-flight": "NVIDIA/cuda-checkpoint README: on a suspend \"already-submitted CUDA work, including stream "
                 "callbacks, are completed\"; it \"waits for already-submitted CUDA work to finish before completing "
                 "a checkpoint\" (a step left at its launch is found done once the process runs again)",
    "respawn": "the hunt's own step: a fresh probe (no tool involved)",
    "docker-checkpoint": "docker checkpoint create: \"Create a checkpoint from a running container\"; "
                         "--leave-running: \"Leave the container running after checkpoint\" (else it stops)",
    "docker-restore": "docker start --checkpoint: \"Restore from this checkpoint\" into the stopped container (docker "
                      "start: \"Start one or more stopped containers\"); a checkpoint stays until docker checkpoint rm, "
                      "so it may be restored again",
    "docker-restore-new": "docker start --checkpoint-dir: \"Use a custom checkpoint storage directory\": a new container "
                          "started from another container's checkpoint",
    "podman-checkpoint": "podman container checkpoint: checkpoints a running container and stops it; --leave-running: "
                         "\"Leave the container running after checkpointing instead of stopping it\"; --export: \"Export "
                         "the checkpoint to a tar.gz file\"",
    "podman-restore": "podman container restore --import: \"Import a checkpoint tar.gz file, which was exported by "
                      "Podman\"; a container may be \"restored multiple times from an exported checkpoint\" "
                      "(--ignore-static-ip); a name in use is refused",
    "podman-restore-new": "podman container restore --import --name: \"if a container is restored from a checkpoint "
                          "tar.gz file it is possible to rename it with --name\"",
}

STATES = ("running", "locked", "checkpointed", "failed", "gone")
ENGINE_TOOLS = ("docker", "podman")  # the container engines: their own commands, on a probe in a container
TOOLS = ("cuda", "cuda-checkpoint", "criu-cuda-plugin", "criu", *ENGINE_TOOLS)
GPU_TOOLS = ("cuda", "cuda-checkpoint", "criu-cuda-plugin")
API = ("lock", "unlock", "checkpoint", "restore", "restore_filled", "restore_other_gpu")
TWO_GPUS = ("restore_other_gpu",)  # steps only a machine with two GPUs (of one chip type) can take
ENGINE = ("engine_checkpoint", "engine_restore", "engine_restore_new")
LIFECYCLE = (*API, "criu_dump", "criu_restore", "criu_restore_filled", *ENGINE, "respawn")  # the steps that walk the states
RESTORES = ("criu_restore", "criu_restore_filled", "engine_restore", "engine_restore_new")  # need an image
PROBE_WORK = ("step", "alloc", "free")  # the probe's own work: only while RUNNING (it would block, not fail)
INVARIANTS = ("documented_transition", "bounded_failure", "continues_identically", "bounded_time", "nothing_left")


@dataclass(frozen=True)
class Step:
    """One action with its arguments, as the hunt draws it and a reproducer replays it."""

    action: str
    args: tuple[tuple[str, object], ...] = ()

    def to_json(self) -> dict[str, object]:
        """Return ``{"action", "args"}``: the form a reproducer's SEQUENCE holds."""
        return {"action": self.action, "args": dict(self.args)}

    def __str__(self) -> str:
        return self.action + (f"({', '.join(f'{k}={v}' for k, v in self.args)})" if self.args else "")


def _alphabet(tool: str) -> tuple[Step, ...]:
    # A step at its device_done phase (its work waited for) and one left at its launch (its work in flight when
    # the next step comes: the support matrix's cut at op 2's launch is one choice among the others).
    common = (Step("kill"), Step("signal"), Step("fork"), Step("fork", (("exec_", True),)),
              Step("step", (("k", 1),)), Step("step", (("k", 2), ("phase", "launch"))), Step("alloc"), Step("free"),
              Step("respawn"))
    if tool in ENGINE_TOOLS:
        return (Step("engine_checkpoint"), Step("engine_checkpoint", (("leave_running", True),)), Step("engine_restore"),
                Step("engine_restore_new"), *common)
    criu = (Step("criu_dump"), Step("criu_dump", (("leave_running", True),)), Step("criu_restore"))
    if tool == "criu":
        return criu + common
    gpu = (Step("thread_call"),)
    if tool == "criu-cuda-plugin":
        return criu + (Step("criu_restore_filled"),) + gpu + common
    # The driver API's restore onto another GPU (its GPU UUID pairs) is the cuda tool's; the utility's is not modelled.
    other: tuple[Step, ...] = (Step("restore_other_gpu"),) if tool == "cuda" else ()
    api = (Step("lock", (("timeout_ms", 5000),)), Step("lock", (("timeout_ms", 1),)), Step("unlock"),
           Step("checkpoint"), Step("restore"), Step("restore_filled"), *other)
    return api + criu + gpu + common


ALPHABETS = {tool: _alphabet(tool) for tool in TOOLS}

# The probes the search picks from, per tool (each sequence starts one; the lifecycle kit's PROBE says what each
# holds): on a GPU, buffers on the default stream, on two streams joined by an event, and mirrored into pinned
# host memory by an async copy.
GPU_PROBES = ("buffers", "streams", "pinned")


def probes(tool: str) -> tuple[str, ...]:
    """The probe variants a sequence of ``tool`` may start (the first is the plain one a shrink ends at)."""
    return GPU_PROBES if check_tool(tool) in GPU_TOOLS else ("buffers",)


@dataclass(frozen=True)
class World:
    """The probe as the model sees it: its state, and the state its CRIU image holds (None: no image)."""

    state: str = "running"
    image: str | None = None


@dataclass(frozen=True)
class Expect:
    """The documented answer: the answers allowed, the state after each, and the source."""

    answers: frozenset[str]
    after_ok: str
    after_refused: str
    source: str

    def describe(self) -> str:
        """Return "ok → locked" or "refused (stays running)", as a finding states the promise."""
        parts = []
        if "ok" in self.answers:
            parts.append(f"ok → {self.after_ok}")
        if "refused" in self.answers:
            parts.append(f"refused (stays {self.after_refused})")
        return " or ".join(parts) or "gone"


# The driver API's four calls (the utility's actions are the same calls): the state each needs, the state it leaves.
API_VALID_IN = {"lock": "running", "unlock": "locked", "checkpoint": "locked", "restore": "checkpointed",
                "restore_filled": "checkpointed", "restore_other_gpu": "checkpointed"}
API_AFTER = {"lock": "locked", "unlock": "running", "checkpoint": "checkpointed", "restore": "locked",
             "restore_filled": "locked", "restore_other_gpu": "locked"}


def _ok(after: str, source: str) -> Expect:
    return Expect(frozenset({"ok"}), after, after, source)


def _refused(state: str, source: str) -> Expect:
    return Expect(frozenset({"refused"}), state, state, source)


def expect(tool: str, world: World, step: Step, overrides: dict[str, str] | None = None) -> Expect:
    """The documented answer of ``tool`` to ``step`` in ``world``.

    ``overrides`` maps ``"action@state"`` to ``"ok"`` or ``"refused"``: a
    stated model in place of the documented one (how the hunt's own tests give
    it a promise the tool does not keep, to see the search find and shrink it).
    """
    s, a = world.state, step.action
    if overrides and f"{a}@{s}" in overrides:
        want = overrides[f"{a}@{s}"]
        base = _expect(tool, world, step)
        after = base.after_ok if "ok" in base.answers else _next_if_ok(tool, world, step)
        return Expect(frozenset({want}), after, s, "the hunt's stated model (an override)")
    return _expect(tool, world, step)


def _next_if_ok(tool: str, world: World, step: Step) -> str:
    """Where an action that the documentation refuses would lead if it succeeded (for a stated model)."""
    a = step.action
    if a in API_AFTER:
        return API_AFTER[a]
    if a == "criu_restore":
        return world.image or "running"
    if a in ("criu_dump", "engine_checkpoint") and not dict(step.args).get("leave_running"):
        return "gone"
    if a in ("engine_restore", "engine_restore_new"):
        return world.image or "running"
    return world.state


def _expect(tool: str, world: World, step: Step) -> Expect:
    s, a = world.state, step.action
    if a == "respawn":
        return _ok("running", SOURCES["respawn"])
    if a in ENGINE:
        return _expect_engine(tool, world, step)
    if s == "gone":
        if a == "criu_restore" and world.image is not None:
            return _ok(world.image, SOURCES["criu-restore"] if tool == "criu" or world.image != "running"
                       else SOURCES["criu-plugin"])
        if a == "criu_restore_filled" and world.image is not None:
            return Expect(frozenset({"ok", "refused"}), world.image, "gone", SOURCES["criu-plugin"])
        if a in ("criu_restore", "criu_restore_filled"):
            return _refused("gone", SOURCES["criu-restore"])
        return Expect(frozenset({"gone"}), "gone", "gone", SOURCES["kill"])
    if a == "kill":
        return _ok("gone", SOURCES["kill"])
    if a in ("signal", "fork"):
        return _ok(s, SOURCES[a])
    if a == "thread_call":
        return _ok(s, SOURCES["locked-blocks"])
    if a in PROBE_WORK:
        source = SOURCES["work"] + ("; " + SOURCES["in-flight"] if dict(step.args).get("phase") == "launch" else "")
        return _ok(s, source) if s == "running" else _refused(s, source)
    if a in ("criu_restore", "criu_restore_filled"):
        # The PID is taken by the process that runs now.
        return _refused(s, SOURCES["criu-restore"])
    if a == "criu_dump":
        leave = bool(dict(step.args).get("leave_running"))
        if tool == "criu" or (tool == "criu-cuda-plugin" and s == "running") or s == "checkpointed":
            source = SOURCES["criu-dump"] if tool == "criu" else (
                SOURCES["criu-plugin"] if tool == "criu-cuda-plugin" else SOURCES["criu-gpu"])
            return _ok(s if leave else "gone", source)
        return _refused(s, SOURCES["criu-gpu"])
    source_key = {"restore_filled": "restore", "restore_other_gpu": "restore-other-gpu"}.get(a, a)
    if a not in API_VALID_IN:
        raise InvalidArgument(f"hunt: unknown action {a!r}; the actions are "
                              f"{sorted({x.action for x in ALPHABETS[check_tool(tool)]})}")
    if tool == "criu-cuda-plugin":
        return _refused(s, "the plugin's lifecycle has no such call")
    if s != API_VALID_IN[a]:
        return _refused(s, SOURCES[source_key] + " " + SOURCES["refusal"])
    if a == "restore_filled":
        return Expect(frozenset({"ok", "refused"}), "locked", "checkpointed", SOURCES["restore-filled"])
    timeout_ms = dict(step.args).get("timeout_ms", 0)
    if a == "lock" and isinstance(timeout_ms, int) and 0 < timeout_ms < 100:
        return Expect(frozenset({"ok", "refused"}), "locked", "running", SOURCES["lock-timeout"])
    return _ok(API_AFTER[a], SOURCES[source_key])


def _expect_engine(tool: str, world: World, step: Step) -> Expect:
    """A container engine's documented answer to one of its own steps (:data:`ENGINE`)."""
    s, a = world.state, step.action
    if a == "engine_checkpoint":
        if s == "gone":
            return Expect(frozenset({"gone"}), "gone", "gone", SOURCES[f"{tool}-checkpoint"])
        return _ok(s if dict(step.args).get("leave_running") else "gone", SOURCES[f"{tool}-checkpoint"])
    source = SOURCES[f"{tool}-restore-new" if a == "engine_restore_new" else f"{tool}-restore"]
    if s == "running":  # the container to restore into runs (or its name is in use): nothing to restore into
        return _refused(s, source)
    return _ok(world.image or "running", source)


def advance(tool: str, world: World, step: Step, answer: str, state: str) -> World:
    """The world after ``step`` answered ``answer`` with the probe now in ``state`` (what was observed wins)."""
    if step.action == "respawn":
        return World()
    if step.action == "engine_restore_new" and answer == "ok":
        # A migration: the copy under its new name is the probe now, and the checkpoint stays with the container it
        # was taken of (restoring that one too would start a second probe on one command directory).
        return World(state=state if state in STATES else world.state)
    if step.action in ("criu_dump", "engine_checkpoint") and answer == "ok":
        return World(state=state, image=world.state)
    return replace(world, state=state if state in STATES else world.state)


def valid(tool: str, world: World, overrides: dict[str, str] | None = None, gpus: int = 1) -> tuple[Step, ...]:
    """The steps of ``tool``'s alphabet the documentation answers with ``ok`` in ``world`` (the directed search's moves)."""
    return tuple(step for step in safe(tool, world, gpus) if "ok" in expect(tool, world, step, overrides).answers)


def moves(tool: str, world: World, overrides: dict[str, str] | None = None,
          gpus: int = 1) -> dict[str, tuple[Step, ...]]:
    """The steps open in ``world``, in two kinds: ``advance`` (a lifecycle step documented to succeed, or a
    step of the probe's left at its launch, so that the next one falls while its work is in flight) and
    ``detour`` (everything else the hunt may take: steps that keep the state, and misuse the documentation
    refuses). The directed search draws from both kinds equally, so it walks the
    lifecycle deep while still trying every refusal on the way.
    """
    ok = valid(tool, world, overrides, gpus)
    # A step left at its launch advances too: it places the next lifecycle step among the probe's phases.
    advance = tuple(st for st in ok if st.action in LIFECYCLE or dict(st.args).get("phase") == "launch")
    return {"advance": advance, "detour": tuple(st for st in safe(tool, world, gpus) if st not in advance)}


def safe(tool: str, world: World, gpus: int = 1) -> tuple[Step, ...]:
    """Every step the hunt may take in ``world`` on a machine of ``gpus`` GPUs: all but the probe's own work
    outside RUNNING (it would wait, not fail), a restore with no image (there is nothing to ask the tool), an
    engine's restore under a new name while the probe runs (two probes would answer one command directory), and
    a step that needs two GPUs on a machine with one."""
    return tuple(st for st in ALPHABETS[check_tool(tool)]
                 if not (st.action in TWO_GPUS and gpus < 2)
                 and not (st.action in PROBE_WORK and world.state != "running")
                 and not (st.action == "respawn" and world.state != "gone")
                 and not (st.action in RESTORES and world.image is None)
                 and not (st.action == "engine_restore_new" and world.state != "gone"))


PUBLIC_REPORTS = {
    "moby/moby#42900": "docker start --checkpoint refused: \"failed to upload checkpoint to containerd: ... already "
                       "exists\" (the checkpoint's tarball still in containerd's content store)",
    "containerd/containerd#10166": "containerd leaves each restore's unpacked checkpoint copy (ctrd-checkpoint*) in "
                                   "its temporary directory",
    "moby/moby#37344": "restoring a container from a custom --checkpoint-dir is broken: \"custom checkpointdir is not "
                       "supported\"",
    "checkpoint-restore/criu#293": "a comment there: \"It should probably also be an error to call docker start on a "
                                   "container that is already running\"",
    "NVIDIA/cuda-checkpoint#44": "a restore after a failed (out-of-memory) restore stays CHECKPOINTED for good",
    "NVIDIA/cuda-checkpoint#53": "killing a restored process hung the host (driver 595)",
}


def public_report(action: str, invariant: str, sequence: list[str], detail: str = "") -> str:
    """The public report a deviation matches (its number and words), or "not found in any public report"
    (``detail``: the tool's words, where they name the report's symptom)."""
    before = sequence[:-1]
    if action.startswith("engine_restore") and "already exists" in detail:
        key = "moby/moby#42900"
    elif action == "engine_restore_new" and "custom checkpointdir is not supported" in detail:
        key = "moby/moby#37344"
    elif action == "engine_restore" and "restored nothing" in detail:
        key = "checkpoint-restore/criu#293"
    elif invariant == "nothing_left" and "ctrd-checkpoint" in detail:
        key = "containerd/containerd#10166"
    elif action in API and any(s.startswith(("restore_filled", "criu_restore_filled")) for s in before):
        key = "NVIDIA/cuda-checkpoint#44"
    elif action == "kill" and invariant == "bounded_time" and any("restore" in s for s in before):
        key = "NVIDIA/cuda-checkpoint#53"
    else:
        return "not found in any public report"
    return f"{key}: {PUBLIC_REPORTS[key]}"


def check_tool(tool: str) -> str:
    """Return ``tool`` when it has a lifecycle model; a :class:`InvalidArgument` naming the choices otherwise."""
    if tool not in TOOLS:
        raise InvalidArgument(f"hunt: no lifecycle model for tool {tool!r}; the tools are {', '.join(TOOLS)}")
    return tool
