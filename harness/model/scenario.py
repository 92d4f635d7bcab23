"""Scenario files: TOML in, a validated :class:`Scenario` out.

Every field is checked at load time; an error names the field, the bad value
and the allowed values (``InvalidArgument``), so a typo never surfaces later
as a failed trial. ``include = ["base.toml"]`` merges other files first (this
file's tables win), and ``overrides`` (``--set plan.source=random`` on the
command line) are applied last. See ``scenarios/README.md`` for the reference.

Each field's type, default, bounds and allowed values are declared once, in
:mod:`cutbench.harness.model.schema`; this module adds what the schema cannot
say of one field alone: includes, overrides, ``[[variants]]``, and the checks
of a field against another or against the workload.
"""

from __future__ import annotations

import copy
import itertools
import tomllib
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import tomli_w

from cutbench.errors import InvalidArgument
from cutbench.files import read_document
from cutbench.harness.model import schema
from cutbench.harness.model.certificate import CERTIFY_OFF
from cutbench.harness.model.plan import SAME_GPU
# Re-exported: the rooms above name these vocabularies and bounds through the scenario (schema.py declares them).
from cutbench.harness.model.schema import ARRAYS as ARRAYS
from cutbench.harness.model.schema import EXECUTORS as EXECUTORS
from cutbench.harness.model.schema import LIMITS as LIMITS
from cutbench.harness.model.schema import PLAN_SOURCES as PLAN_SOURCES
from cutbench.harness.model.schema import PROFILES as PROFILES
from cutbench.harness.model.schema import RECEIVER_MODES as RECEIVER_MODES
from cutbench.registry import backend_capabilities
from cutbench.validate import check_choice, check_choices

if TYPE_CHECKING:
    from cutbench.workloads.api import Workload


@dataclass(frozen=True)
class Arm:
    """One point of the sweep: the axes a trial is grouped by in results."""

    backend: str
    receiver_mode: str
    fault: str
    crash_after_ms: float
    split_window_ms: float
    # Each default is the scenario field's first value (harness/model/schema.py).
    rank_skew_ms: float = schema.default("pipeline.rank_skew_ms")[0]
    restore_target: str = schema.default("pipeline.restore_targets")[0]
    # Recovery-cut certificates: off, audit (record) or enforce (refuse ineligible cuts).
    certify: str = schema.default("pipeline.certify")[0]
    # CRIU's own options for every CRIU the backend runs (pipeline.criu_options; none for a backend that runs none).
    criu_options: tuple[str, ...] = schema.default("pipeline.criu_options")[0]
    # The hypothesis source draws each cut's crash delay and split window from these (empty: the single value above).
    crash_choices: tuple[float, ...] = ()
    split_choices: tuple[float, ...] = ()

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Arm":
        """An Arm from its stored form (a trial file's ``spec.arm``, a Ray request): lists back to tuples, an axis
        a run stored before it existed at its default. :class:`InvalidArgument` names an unknown or missing key."""
        if not isinstance(data, dict):
            raise InvalidArgument(f"arm: expected a table, got {type(data).__name__}")
        fields = cls.__dataclass_fields__
        unknown = sorted(set(data) - set(fields))
        if unknown:
            raise InvalidArgument(f"arm: unknown field(s) {', '.join(unknown)}")
        values: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items()}
        try:
            return cls(**values)
        except TypeError as exc:
            raise InvalidArgument(f"arm: {exc}") from None

    def label(self) -> str:
        """A short label such as ``criu/idempotent/kill``."""
        s = f"{self.backend}/{self.receiver_mode}/{self.fault}"
        if self.fault == "leave_running":
            s += "+" + "|".join(f"{c:g}" for c in (self.crash_choices or (self.crash_after_ms,))) + "ms"
        if self.split_choices and any(self.split_choices):
            s += "/split" + "|".join(f"{c:g}" for c in self.split_choices) + "ms"
        elif self.split_window_ms:
            s += f"/split{self.split_window_ms:g}ms"
        if self.rank_skew_ms:
            s += f"/skew{self.rank_skew_ms:g}ms"
        if self.restore_target != SAME_GPU:
            s += f"/{self.restore_target}"
        if self.certify != CERTIFY_OFF:
            s += f"/{self.certify}"
        if self.criu_options:
            s += "/criu:" + "+".join(o.removeprefix("--") for o in self.criu_options)
        return s


# Each field of an Arm and the Scenario attribute that lists its values (the schema's fields marked ``arm``);
# ``tests/unit/test_scenario_schema.py`` holds the two to the same axes.
ARM_AXES: dict[str, str] = {
    "backend": "backends", "receiver_mode": "modes", "fault": "faults", "crash_after_ms": "crash_after_ms",
    "split_window_ms": "split_window_ms", "rank_skew_ms": "rank_skew_ms", "restore_target": "restore_targets",
    "certify": "certify", "criu_options": "criu_options",
}


@dataclass(frozen=True)
class Scenario:
    """A validated scenario. ``arms()`` gives the sweep; the plan fields feed the scheduler."""

    # Each default is the schema's (harness/model/schema.py), where every field is declared once.
    name: str
    description: str = schema.default("description")
    workload: str = schema.default("workload.name")
    array: str = schema.default("workload.array")
    params: dict[str, Any] = field(default_factory=dict)  # the schema's {}, one dict per scenario
    store: str = schema.default("receiver.store")
    modes: tuple[str, ...] = schema.default("receiver.modes")
    backends: tuple[str, ...] = schema.default("pipeline.backends")
    faults: tuple[str, ...] = schema.default("pipeline.faults")
    crash_after_ms: tuple[float, ...] = schema.default("pipeline.crash_after_ms")
    split_window_ms: tuple[float, ...] = schema.default("pipeline.split_window_ms")
    rank_skew_ms: tuple[float, ...] = schema.default("pipeline.rank_skew_ms")
    restore_targets: tuple[str, ...] = schema.default("pipeline.restore_targets")
    certify: tuple[str, ...] = schema.default("pipeline.certify")
    criu_options: tuple[tuple[str, ...], ...] = schema.default("pipeline.criu_options")
    keep_images: bool = schema.default("pipeline.keep_images")
    images_dir: str = schema.default("pipeline.images_dir")
    # A measured support matrix (a `cutbench matrix` run directory or its matrix.parquet): the certificate's
    # verdict on each CUDA feature a workload declares. "" = none given (such features are unmeasured).
    support_matrix: str = schema.default("pipeline.support_matrix")
    skip_unavailable: bool = schema.default("pipeline.skip_unavailable")
    expect_refusals: bool = schema.default("pipeline.expect_refusals")
    plan_source: str = schema.default("plan.source")
    plan_ops: tuple[int, int] = schema.default("plan.ops")
    # The parser resolves plan.phases ("all" by default) against the workload; () only in a Scenario built by hand.
    plan_phases: tuple[str, ...] = ()
    trials: int = schema.default("plan.trials")
    seed: int = schema.default("plan.seed")
    cuts_per_trial: int = schema.default("plan.cuts_per_trial")
    # The periodic source: a cut every ``interval_ops`` ops over plan.ops (0: no cut, the native run).
    interval_ops: int = schema.default("plan.interval_ops")
    cut_mode: str = schema.default("plan.cut_mode")
    async_offset_ms: tuple[float, ...] = schema.default("plan.async_offset_ms")
    # The system calls a program's cut of phase "syscall" counts (the parser gives them to workload.params.syscalls).
    syscalls: tuple[str, ...] = schema.default("plan.syscalls")
    profile: str = schema.default("plan.profile")
    watchdog_s: float = schema.default("run.watchdog_s")
    trial_timeout_s: float = schema.default("run.trial_timeout_s")
    stage_timeout_s: float = schema.default("run.stage_timeout_s")
    # How long the workload's semantic adapters have to join a cut (prepare) before it is called off.
    prepare_timeout_s: float = schema.default("run.prepare_timeout_s")
    # Stop after the first invalid trial, running the plans one at a time in order (``SerialExecutor``).
    stop_at_first_invalid: bool = schema.default("run.stop_at_first_invalid")
    # Trials run at once (``run.jobs``): an integer, or "auto" (see check_jobs); the runner resolves "auto".
    jobs: int | str = schema.default("run.jobs")
    trials_per_gpu: int = schema.default("run.trials_per_gpu")
    # What runs the trials: worker threads of this process, or Ray tasks (``run.executor``,
    # see check_executor); ``ray_address`` empty starts a local Ray.
    executor: str = schema.default("run.executor")
    ray_address: str = schema.default("run.ray_address")
    source_path: str = ""
    # ``[[variants]]``: named overlays of this scenario (e.g. one per workload),
    # each a complete scenario; a run runs all of them instead of this one.
    variant: str = ""
    variants: tuple["Scenario", ...] = ()

    def arms(self) -> list[Arm]:
        """The cartesian product backend × mode × fault × crash delay × split window × … (every arm axis).

        Crash delays only multiply ``leave_running``; split windows only multiply
        backends that have one (``cuda+criu``); rank skews and restore targets
        only multiply backends that drive the CUDA driver; CRIU's options only
        backends that run CRIU (each backend declares these in its ``capabilities``).
        """
        out = []
        for backend, mode, fault in itertools.product(self.backends, self.modes, self.faults):
            caps = backend_capabilities(backend)
            crashes = self.crash_after_ms if fault == "leave_running" else (0.0,)
            splits = self.split_window_ms if caps.split_window else (0.0,)
            cuda = caps.drives_cuda
            skews = self.rank_skew_ms if cuda else (0.0,)
            targets = self.restore_targets if cuda else (SAME_GPU,)
            options = self.criu_options if "criu" in caps.tools else ((),)
            for crash, split, skew, target, cert, opts in itertools.product(crashes, splits, skews, targets,
                                                                            self.certify, options):
                out.append(Arm(backend, mode, fault, float(crash), float(split), float(skew), target, cert, opts))
        return out

    def workload_class(self) -> "type[Workload]":
        """The class of this scenario's workload (every reader of a scenario gets it here); :class:`InvalidArgument`
        naming ``workload.name`` when it cannot be loaded."""
        return _workload_class(self.workload)

    def narrowed(self, arm: Arm) -> "Scenario":
        """This scenario with one arm: every arm axis set to ``arm``'s value, no ``[[variants]]``.

        Its plans are those the full run draws for that arm (plan seeds depend on the arm only).
        """
        axes: dict[str, Any] = {attr: (getattr(arm, name),) for name, attr in ARM_AXES.items()}
        return replace(self, variants=(), **axes)

    def to_dict(self) -> dict[str, Any]:
        """The resolved scenario as plain data (written to ``run.toml``)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Scenario":
        """Inverse of :meth:`to_dict`, from ``run.toml``'s ``[scenario]`` table (lists back to tuples, absent
        keys at their defaults, as TOML drops empty values); :class:`InvalidArgument` naming an unknown key."""
        if not isinstance(data, dict):
            raise InvalidArgument(f"stored scenario: expected a table, got {type(data).__name__}")
        unknown = sorted(set(data) - set(cls.__dataclass_fields__))
        if unknown:
            raise InvalidArgument(f"stored scenario: unknown field(s) {', '.join(unknown)} (made by another cutbench)")
        fields = {}
        for name, value in data.items():
            if name == "variants":
                value = tuple(cls.from_dict(v) for v in value)
            elif isinstance(value, list):
                value = tuple(tuple(v) if isinstance(v, list) else v for v in value)  # criu_options: lists of lists
            fields[name] = value
        return cls(**fields)


def select_variants(scenario: "Scenario", names: tuple[str, ...] | list[str]) -> "Scenario":
    """Return ``scenario`` with only the ``[[variants]]`` named in ``names`` (all of them when ``names`` is empty).

    Raises :class:`InvalidArgument` naming an unknown variant and the known ones.
    """
    if not names:
        return scenario
    known = [v.variant for v in scenario.variants]
    unknown = [n for n in names if n not in known]
    if unknown:
        raise InvalidArgument(f"--variant {', '.join(unknown)}: the scenario has "
                              + (f"the variants {', '.join(known)}" if known else "no [[variants]]"))
    return replace(scenario, variants=tuple(v for v in scenario.variants if v.variant in names))


def load_scenario(path: "str | Path | Mapping[str, Any]", overrides: list[str] | None = None) -> Scenario:
    """Read, merge (``include``), override and validate a scenario file; or, given a mapping (a scenario as
    parsed TOML, built in code), override and validate that. Returns the :class:`Scenario`; raises
    :class:`InvalidArgument` naming the first bad field."""
    if isinstance(path, Mapping):
        if "include" in path:  # a file's includes are relative to the file: a mapping has none to be read from
            raise InvalidArgument("include: a scenario given as a mapping cannot include files; load the file that "
                                  "includes them (load_scenario(PATH)), or merge them into the mapping")
        data = copy.deepcopy(dict(path))
        source = ""
    else:
        data, source = _read_with_includes(Path(path), seen=()), str(path)
    for item in overrides or []:
        apply_override(data, item)
    return parse_scenario(data, source_path=source, overrides=overrides)


def parse_scenario(data: dict[str, Any], source_path: str = "", overrides: list[str] | None = None) -> Scenario:
    """Validate a scenario mapping (already parsed TOML) into a :class:`Scenario`; return it.

    Each ``[[variants]]`` table is merged over the rest of ``data``, then
    ``overrides`` are applied again (the command line wins over a variant).
    Types, defaults, bounds and allowed values are the schema's
    (:mod:`cutbench.harness.model.schema`); what this adds is the checks of one
    field against another and against the workload. Raises
    :class:`InvalidArgument` naming the first bad field.
    """
    _check_keys(data, "")
    variants = _parse_variants(data, source_path, overrides or [])
    tables = {"": data, **{section: _table(data, section) for section in schema.SECTIONS}}

    def get(key: str, *absent: Any) -> Any:
        """Field ``key`` as the schema checks it; when the file leaves it out, ``absent`` or else the schema's default."""
        f = schema.lookup(key)
        table = tables[f.section]
        if f.name not in table:
            return absent[0] if absent else f.default
        return schema.check(f, table[f.name])

    # First the fields with a form or a dependency of their own, in the order they have always been checked.
    name = get("name", Path(source_path).stem or "scenario")
    workload = get("workload.name")
    params = _validate_workload(workload, dict(get("workload.params")), Path(source_path).parent if source_path else Path.cwd())
    store = get("receiver.store")
    if store != "sqlite" and not store.startswith(("postgresql://", "postgres://", "sqlite:")):
        raise InvalidArgument(f"receiver.store = {store!r}: allowed 'sqlite', 'sqlite:PATH' or a postgresql:// URL")
    plan_ops = get("plan.ops")
    if (
        len(plan_ops) != 2
        or not all(isinstance(v, int) and not isinstance(v, bool) for v in plan_ops)
        or not 1 <= plan_ops[0] <= plan_ops[1] <= LIMITS["plan.ops"]
    ):
        raise InvalidArgument(f"plan.ops = {plan_ops!r}: expected [first, last] with 1 <= first <= last <= {LIMITS['plan.ops']:,}")
    phases_allowed = _workload_phases(workload)
    phases = get("plan.phases")
    if phases == "all":  # a program's system-call cuts are asked for by name: they trace it
        phases = [p for p in phases_allowed if p != SYSCALL]
    if isinstance(phases, str):
        raise InvalidArgument(f"plan.phases = {phases!r}: use \"all\" or a list of {', '.join(phases_allowed)}")
    phases = check_choices("plan.phases", phases, phases_allowed)
    ops_total = params.get("ops")
    # A syscall cut's op numbers the program's counted calls, checked against its uninterrupted runs' count.
    if isinstance(ops_total, int) and plan_ops[1] > ops_total and SYSCALL not in phases:
        raise InvalidArgument(f"plan.ops = {plan_ops!r}: last op exceeds workload.params.ops = {ops_total}")
    # An absent address is not an empty one: check_executor refuses any address given without Ray.
    executor, ray_address = check_executor(get("run.executor"), get("run.ray_address", None))
    own = {"name": name, "workload": workload, "params": params, "store": store, "plan_ops": (plan_ops[0], plan_ops[1]),
           "plan_phases": tuple(phases), "executor": executor, "ray_address": ray_address}
    # Every other field is the schema's alone, checked in the order it is declared.
    rest = {f.attr: get(f.key) for f in schema.FIELDS if f.attr and f.attr not in own and f.attr != "jobs"}
    program = _is_program(workload)
    if program and "fenced" in rest["modes"]:
        raise InvalidArgument("receiver.modes: a program's outside world is at_least_once (every repeat of an effect "
                              "is seen) or idempotent (it keeps an effect once: a repeat with the same payload is "
                              "recomputed work); fenced needs a receiver the program talks to")
    if program and rest["cut_mode"] != "async":
        raise InvalidArgument(f"plan.cut_mode = {rest['cut_mode']!r}: a program cannot park at a point; set "
                              "plan.cut_mode = \"async\" (the cut lands after the k-th effect it shows, plus "
                              "plan.async_offset_ms)")
    if SYSCALL in phases:
        own["params"] = params = _syscall_cuts(params, rest)
    # Under Ray, as many trials at once as its resources hold unless run.jobs caps them.
    jobs = check_jobs("run.jobs", get("run.jobs", "auto" if executor in ("ray", "slurm") else schema.default("run.jobs")))
    if program and params.get("port") and jobs != 1:
        raise InvalidArgument(f"workload.params.port = {params['port']}: trials that run at once cannot share one "
                              "port; set port = 0 (a free one per trial) or run.jobs = 1")
    return Scenario(**own, **rest, jobs=jobs, source_path=source_path, variants=variants)


# A program's cut at its own system calls (docs/programs.md, "Cuts at system calls").
SYSCALL = "syscall"


def _syscall_cuts(params: dict[str, Any], rest: dict[str, Any]) -> dict[str, Any]:
    """A program's parameters for cuts of phase ``syscall``: the calls that count (``plan.syscalls``) given to the
    program (its runs are traced, and its recorded reference keeps the boundaries); :class:`InvalidArgument` for a
    plan that would cut it more than once (a restored or started-again program's later calls are not the
    recording's to number)."""
    if rest["cuts_per_trial"] != 1 or rest["plan_source"] == "periodic":
        what = "plan.source = \"periodic\"" if rest["plan_source"] == "periodic" else f"plan.cuts_per_trial = {rest['cuts_per_trial']}"
        raise InvalidArgument(f"{what}: a program is cut at its system calls once a trial (plan.phases has \"syscall\"); "
                              "set plan.cuts_per_trial = 1 and plan.source = \"exhaustive\", \"random\" or \"hypothesis\"")
    return {**params, "syscalls": list(rest["syscalls"])}


# Tables a variant may overlay. The receiver store is the run's (one session, one store).
_VARIANT_KEYS = ("name", "workload", "receiver", "pipeline", "plan", "run")


def _parse_variants(data: dict[str, Any], source_path: str, overrides: list[str]) -> tuple[Scenario, ...]:
    """The ``[[variants]]`` of ``data``, each merged over the rest and validated."""
    raw = data.get("variants", [])
    if not isinstance(raw, list) or not all(isinstance(v, dict) for v in raw):
        raise InvalidArgument("variants: expected [[variants]] tables, each with a name")
    base = {k: v for k, v in data.items() if k != "variants"}
    out: list[Scenario] = []
    for i, table in enumerate(raw):
        name = table.get("name")
        where = f"variants[{i}]"
        if not isinstance(name, str) or not name.strip():
            raise InvalidArgument(f"{where}.name = {name!r}: expected a non-empty string")
        if any(s.variant == name for s in out):
            raise InvalidArgument(f"{where}.name = {name!r}: used by an earlier variant")
        unknown = sorted(set(table) - set(_VARIANT_KEYS))
        if unknown:
            raise InvalidArgument(f"{where} ({name}): unknown field(s) {unknown}; allowed: {', '.join(_VARIANT_KEYS)}")
        for key in sorted(schema.per_run_keys()):
            section, _, field_name = key.partition(".")
            if not (isinstance(table.get(section), dict) and field_name in table[section]):
                continue
            if key == "receiver.store":
                raise InvalidArgument(f"{where}.receiver.store: a run has one receiver store; set it at the top level")
            if key == "run.stop_at_first_invalid":
                raise InvalidArgument(f"{where}.run.stop_at_first_invalid: a run stops once, for all its variants; set "
                                      "it at the top level (or pass --set run.stop_at_first_invalid=true)")
            option = "--jobs" if field_name in ("jobs", "trials_per_gpu") else f"--{field_name.replace('_', '-')}"
            raise InvalidArgument(f"{where}.run.{field_name}: a run has one pool of trials running at once; "
                                  f"set run.{field_name} at the top level (or pass {option})")
        merged = copy.deepcopy(base)
        _deep_merge(merged, copy.deepcopy({k: v for k, v in table.items() if k != "name"}))
        for item in overrides:
            apply_override(merged, item)
        try:
            sub = parse_scenario(merged, source_path)
        except InvalidArgument as exc:
            raise _blame(exc, base, overrides, source_path, f"{where} ({name})") from None
        if sub.plan_source == "hypothesis":
            raise InvalidArgument(f"{where} ({name}): plan.source = 'hypothesis' is adaptive; variants run exhaustive or random plans")
        out.append(replace(sub, variant=name))
    return tuple(out)


def _blame(exc: InvalidArgument, base: dict[str, Any], overrides: list[str], source_path: str, variant: str) -> InvalidArgument:
    """The error of a variant merged over the base: the base's own when the base alone fails the same way (a
    typo in a table every variant shares is not the first variant's), else the variant's."""
    alone = copy.deepcopy(base)
    for item in overrides:
        apply_override(alone, item)
    try:
        parse_scenario(alone, source_path)
    except InvalidArgument as own:
        if str(own) == str(exc):
            return InvalidArgument(f"{exc} (in the tables every variant shares)")
    return InvalidArgument(f"{variant}: {exc}")


def parse_jobs(where: str, text: str) -> int | str:
    """A command line's ``N|auto`` (``--jobs``, ``--cutbench-jobs``) checked as :func:`check_jobs` checks ``run.jobs``."""
    return check_jobs(where, int(text) if text.strip().isdigit() else text)


def check_jobs(where: str, value: Any) -> int | str:
    """Return ``value`` as a number of trials to run at once: an integer from 1 to ``LIMITS["run.jobs"]``, or "auto".

    "auto" is one trial per CPU, or on a GPU host ``run.trials_per_gpu`` per
    GPU (the runner resolves it). ``where`` names the field or option in the
    error (``run.jobs``, ``--jobs``), with the fix.
    """
    if value == "auto":
        return value
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= LIMITS["run.jobs"]:
        raise InvalidArgument(f"{where} = {value!r}: expected a whole number of trials to run at once, 1 to "
                              f"{LIMITS['run.jobs']} (1 runs them one after another), or \"auto\" (one per CPU, "
                              "or run.trials_per_gpu per GPU on a GPU host)")
    return value


def check_executor(executor: Any, ray_address: Any = None) -> tuple[str, str]:
    """Return ``(run.executor, run.ray_address)`` checked together; return them (the address "" when absent).

    ``executor`` is one of :data:`EXECUTORS`. ``ray_address`` is read only
    under ``"ray"``: a Ray cluster's address (``HOST:PORT``, or ``auto`` for
    the one started on this machine); absent, a local Ray starts. A Ray
    Client address (``ray://``) is refused: it runs the trials away from the
    node whose loopback the run's receiver listens on. Errors name the field
    (and the ``cutbench run`` option that sets it) and the fix.
    """
    executor = check_choice("run.executor", executor, EXECUTORS)
    if ray_address is None:
        return executor, ""
    where = f"run.ray_address = {ray_address!r} (--ray-address)"
    if executor != "ray":
        raise InvalidArgument(f"{where}: only read with run.executor = \"ray\" (--executor ray); set it, "
                              "or drop the address")
    if not isinstance(ray_address, str) or not ray_address.strip() or any(c.isspace() for c in ray_address):
        raise InvalidArgument(f"{where}: expected a Ray cluster's address, HOST:PORT or auto "
                              "(leave it out to start a local Ray)")
    if ray_address.startswith("ray://"):
        raise InvalidArgument(f"{where}: a Ray Client address runs the trials away from this machine, whose "
                              "loopback the run's receiver listens on: run cutbench on a node of the cluster and "
                              "give the cluster's HOST:PORT (or auto)")
    return executor, ray_address


# -- helpers ---------------------------------------------------------------


def _read_with_includes(path: Path, seen: tuple[Path, ...]) -> dict[str, Any]:
    path = path.resolve()
    if path in seen:
        raise InvalidArgument(f"include: {path} includes itself (cycle through {', '.join(map(str, seen))})")
    data = read_document(path, tomllib.loads, what="scenario file", fmt="TOML", errors=(tomllib.TOMLDecodeError,))
    includes = data.pop("include", [])
    if isinstance(includes, str):
        includes = [includes]
    if not isinstance(includes, list) or not all(isinstance(i, str) for i in includes):
        raise InvalidArgument(f"include = {includes!r}: expected a file name or a list of file names")
    merged: dict[str, Any] = {}
    variants: list[Any] = []
    for inc in includes:
        included = _read_with_includes(path.parent / inc, seen + (path,))
        variants += included.pop("variants", [])
        _deep_merge(merged, included)
    # [[variants]] is an array of tables: an including file adds to the included ones.
    variants += data.get("variants", [])
    _deep_merge(merged, {k: v for k, v in data.items() if k != "variants"})
    if variants:
        merged["variants"] = variants
    return merged


def _deep_merge(into: dict[str, Any], new: dict[str, Any]) -> None:
    for key, value in new.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _deep_merge(into[key], value)
        else:
            into[key] = value


def toml_value(value: Any) -> str:
    """Return ``value`` as the TOML text an override (``section.key=TEXT``) reads back as ``value``."""
    return tomli_w.dumps({"v": value}).split("=", 1)[1].strip()


def apply_override(data: dict[str, Any], item: str) -> None:
    """Apply ``section.key=value`` where value is parsed as a TOML value (bare words as strings)."""
    dotted, sep, raw = item.partition("=")
    if not sep or not dotted.strip():
        raise InvalidArgument(f"--set {item!r}: expected section.key=value, e.g. plan.source=random")
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    keys = dotted.strip().split(".")
    node = data
    for key in keys[:-1]:
        node = node.setdefault(key, {})
        if not isinstance(node, dict):
            raise InvalidArgument(f"--set {item!r}: {key!r} is not a table")
    node[keys[-1]] = value


def _check_keys(data: dict[str, Any], section: str) -> None:
    allowed = schema.keys(section)
    for key in data:
        if key not in allowed:
            where = f"{section}.{key}" if section else key
            raise InvalidArgument(f"unknown field {where!r}; allowed in {'[' + section + ']' if section else 'the top level'}: {', '.join(allowed)}")


def _table(data: dict[str, Any], name: str) -> dict[str, Any]:
    table = data.get(name, {})
    if not isinstance(table, dict):
        raise InvalidArgument(f"{name} = {table!r}: expected a table [{name}]")
    _check_keys(table, name)
    return table


def _validate_workload(name: str, params: dict[str, Any], base: Path) -> dict[str, Any]:
    """The workload's parameters, complete and checked; paths a parameter names relative to the scenario's folder
    ``base`` made absolute where the workload says which (``anchor``: a program's files)."""
    from cutbench.workloads import api

    # The class is the workload.name's problem (unknown, not importable, not a workload); the parameters, the params'.
    cls = _workload_class(name)
    try:
        out = api.resolve_params(cls, params)
    except api.WorkloadError as exc:
        raise InvalidArgument(f"workload.params: {exc}") from None
    anchor = getattr(cls, "anchor", None)
    return anchor(out, base) if callable(anchor) else out


def _workload_class(name: str) -> "type[Workload]":
    """The class of workload ``name``: the one place a scenario resolves it; :class:`InvalidArgument` naming
    ``workload.name`` when it is unknown, not importable or not a workload."""
    from cutbench.workloads import api

    try:
        return api.load(name)
    except api.WorkloadError as exc:
        raise InvalidArgument(f"workload.name: {exc}") from None


def _is_program(name: str) -> bool:
    """Whether workload ``name`` is a program started as it is (docs/programs.md), not a workload class."""
    from cutbench.workloads import api

    return bool(api.optional(_workload_class(name), "program"))


def _workload_phases(name: str) -> tuple[str, ...]:
    return tuple(_workload_class(name).phases)


