"""Scenario files: TOML in, a validated :class:`Scenario` out.

Every field is checked at load time; an error names the field, the bad value
and the allowed values (``InvalidArgument``), so a typo never surfaces later
as a failed trial. ``include = ["base.toml"]`` merges other files first (this
file's tables win), and ``overrides`` (``--set plan.source=random`` on the
command line) are applied last. See ``scenarios/README.md`` for the reference.
"""

from __future__ import annotations

import copy
import itertools
import tomllib
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import tomli_w

from cutbench.errors import InvalidArgument
from cutbench.harness.model.certificate import CERTIFY_MODES
from cutbench.workloads.xp import ARRAY_BACKENDS
from cutbench.harness.model.plan import FAULTS, RESTORE_TARGETS
from cutbench.files import read_document
from cutbench.registry import CHECKPOINTERS, backend_capabilities
from cutbench.validate import check_choice, check_choices, check_numbers, check_positive, check_range, check_type

RECEIVER_MODES: tuple[str, ...] = ("at_least_once", "idempotent", "fenced")
PLAN_SOURCES: tuple[str, ...] = ("exhaustive", "random", "hypothesis", "periodic")
# Upper bounds of the numeric fields (documented in scenarios/README.md): beyond
# them a run would exhaust memory or time in planning before its first trial.
LIMITS: dict[str, int | float] = {
    "plan.ops": 1_000_000,
    "plan.trials": 1_000_000,
    "plan.cuts_per_trial": 8,
    "plan.exhaustive_plans": 1_000_000,
    "plan.periodic_cuts": 10_000,
    "run.watchdog_s": 86_400,
    "run.trial_timeout_s": 86_400,
    "run.stage_timeout_s": 86_400,
    "run.prepare_timeout_s": 3_600,
    "run.jobs": 1024,
    "run.trials_per_gpu": 64,
    "pipeline.ms": 3_600_000,
}
EXECUTORS: tuple[str, ...] = ("threads", "ray")  # what runs a run's trials (run.executor)
PROFILES: tuple[str, ...] = ("ci", "research")  # of the hypothesis source (cutbench.harness.generator.search)
ARRAYS: tuple[str, ...] = ARRAY_BACKENDS  # the workloads' runtime decides which array libraries exist

_SECTIONS: dict[str, tuple[str, ...]] = {
    "": ("name", "description", "include", "workload", "receiver", "pipeline", "plan", "run", "variants"),
    "workload": ("name", "array", "params"),
    "receiver": ("store", "modes"),
    "pipeline": ("backends", "faults", "crash_after_ms", "split_window_ms", "keep_images", "images_dir", "skip_unavailable",
                 "rank_skew_ms", "restore_targets", "certify", "support_matrix"),
    "plan": ("source", "ops", "phases", "trials", "seed", "cuts_per_trial", "cut_mode", "async_offset_ms", "profile",
             "interval_ops"),
    "run": ("watchdog_s", "trial_timeout_s", "stage_timeout_s", "prepare_timeout_s", "jobs", "trials_per_gpu", "executor", "ray_address"),
}


@dataclass(frozen=True)
class Arm:
    """One point of the sweep: the axes a trial is grouped by in results."""

    backend: str
    receiver_mode: str
    fault: str
    crash_after_ms: float
    split_window_ms: float
    rank_skew_ms: float = 0.0
    restore_target: str = "same"
    certify: str = "off"  # recovery-cut certificates: off, audit (record) or enforce (refuse ineligible cuts)
    # The hypothesis source draws each cut's crash delay and split window from these (empty: the single value above).
    crash_choices: tuple[float, ...] = ()
    split_choices: tuple[float, ...] = ()

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
        if self.restore_target != "same":
            s += f"/{self.restore_target}"
        if self.certify != "off":
            s += f"/{self.certify}"
        return s


@dataclass(frozen=True)
class Scenario:
    """A validated scenario. ``arms()`` gives the sweep; the plan fields feed the scheduler."""

    name: str
    description: str = ""
    workload: str = "counter"
    array: str = "auto"
    params: dict[str, Any] = field(default_factory=dict)
    store: str = "sqlite"
    modes: tuple[str, ...] = ("at_least_once",)
    backends: tuple[str, ...] = ("criu",)
    faults: tuple[str, ...] = ("kill",)
    crash_after_ms: tuple[float, ...] = (100.0,)
    split_window_ms: tuple[float, ...] = (0.0,)
    rank_skew_ms: tuple[float, ...] = (0.0,)
    restore_targets: tuple[str, ...] = ("same",)
    certify: tuple[str, ...] = ("off",)
    keep_images: bool = False
    images_dir: str = "/dev/shm"
    # A measured support matrix (a `cutbench matrix` run directory or its matrix.parquet): the certificate's
    # verdict on each CUDA feature a workload declares. "" = none given (such features are unmeasured).
    support_matrix: str = ""
    skip_unavailable: bool = False
    plan_source: str = "exhaustive"
    plan_ops: tuple[int, int] = (1, 1)
    plan_phases: tuple[str, ...] = ()
    trials: int = 10
    seed: int = 0
    cuts_per_trial: int = 1
    # The periodic source: a cut every ``interval_ops`` ops over plan.ops (0: no cut, the native run).
    interval_ops: int = 0
    cut_mode: str = "precise"
    async_offset_ms: tuple[float, ...] = (0.0,)
    profile: str = "ci"
    watchdog_s: float = 20.0
    trial_timeout_s: float = 120.0
    stage_timeout_s: float = 60.0
    # How long the workload's semantic adapters have to join a cut (prepare) before it is called off.
    prepare_timeout_s: float = 5.0
    # Trials run at once (``run.jobs``): an integer, or "auto" (see check_jobs); the runner resolves "auto".
    jobs: int | str = 1
    trials_per_gpu: int = 1
    # What runs the trials: worker threads of this process, or Ray tasks (``run.executor``,
    # see check_executor); ``ray_address`` empty starts a local Ray.
    executor: str = "threads"
    ray_address: str = ""
    source_path: str = ""
    # ``[[variants]]``: named overlays of this scenario (e.g. one per workload),
    # each a complete scenario; a run runs all of them instead of this one.
    variant: str = ""
    variants: tuple["Scenario", ...] = ()

    def arms(self) -> list[Arm]:
        """The cartesian product backend × mode × fault × crash delay × split window.

        Crash delays only multiply ``leave_running``; split windows only multiply
        backends that have one (``cuda+criu``); rank skews and restore targets
        only multiply backends that drive the CUDA driver (each backend declares
        both in its ``capabilities``).
        """
        out = []
        for backend, mode, fault in itertools.product(self.backends, self.modes, self.faults):
            caps = backend_capabilities(backend)
            crashes = self.crash_after_ms if fault == "leave_running" else (0.0,)
            splits = self.split_window_ms if caps.split_window else (0.0,)
            cuda = caps.drives_cuda
            skews = self.rank_skew_ms if cuda else (0.0,)
            targets = self.restore_targets if cuda else ("same",)
            for crash, split, skew, target, cert in itertools.product(crashes, splits, skews, targets, self.certify):
                out.append(Arm(backend, mode, fault, float(crash), float(split), float(skew), target, cert))
        return out

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
                value = tuple(value)
            fields[name] = value
        return cls(**fields)


def select_variants(scenario: "Scenario", names: tuple[str, ...] | list[str]) -> "Scenario":
    """``scenario`` with only the ``[[variants]]`` named in ``names`` (all of them when ``names`` is empty).

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


def load_scenario(path: str | Path, overrides: list[str] | None = None) -> Scenario:
    """Read, merge (``include``), override and validate a scenario file."""
    data = _read_with_includes(Path(path), seen=())
    for item in overrides or []:
        _apply_override(data, item)
    return parse_scenario(data, source_path=str(path), overrides=overrides)


def parse_scenario(data: dict[str, Any], source_path: str = "", overrides: list[str] | None = None) -> Scenario:
    """Validate a scenario mapping (already parsed TOML) into a :class:`Scenario`.

    Each ``[[variants]]`` table is merged over the rest of ``data``, then
    ``overrides`` are applied again (the command line wins over a variant).
    """
    _check_keys(data, "")
    variants = _parse_variants(data, source_path, overrides or [])
    wl = _table(data, "workload")
    rc = _table(data, "receiver")
    pl = _table(data, "pipeline")
    pn = _table(data, "plan")
    rn = _table(data, "run")

    name = _get(data, "", "name", str, Path(source_path).stem or "scenario")
    workload = _get(wl, "workload", "name", str, "counter")
    params = _get(wl, "workload", "params", dict, {})
    params = _validate_workload(workload, params)
    store = _get(rc, "receiver", "store", str, "sqlite")
    if store != "sqlite" and not store.startswith(("postgresql://", "postgres://", "sqlite:")):
        raise InvalidArgument(f"receiver.store = {store!r}: allowed 'sqlite', 'sqlite:PATH' or a postgresql:// URL")
    plan_ops = _get(pn, "plan", "ops", list, [1, 1])
    if (
        len(plan_ops) != 2
        or not all(isinstance(v, int) and not isinstance(v, bool) for v in plan_ops)
        or not 1 <= plan_ops[0] <= plan_ops[1] <= LIMITS["plan.ops"]
    ):
        raise InvalidArgument(f"plan.ops = {plan_ops!r}: expected [first, last] with 1 <= first <= last <= {LIMITS['plan.ops']:,}")
    ops_total = params.get("ops")
    if isinstance(ops_total, int) and plan_ops[1] > ops_total:
        raise InvalidArgument(f"plan.ops = {plan_ops!r}: last op exceeds workload.params.ops = {ops_total}")
    phases_allowed = _workload_phases(workload)
    phases = _get(pn, "plan", "phases", (list, str), "all")
    if phases == "all":
        phases = list(phases_allowed)
    if isinstance(phases, str):
        raise InvalidArgument(f"plan.phases = {phases!r}: use \"all\" or a list of {', '.join(phases_allowed)}")
    phases = check_choices("plan.phases", phases, phases_allowed)
    executor, ray_address = check_executor(_get(rn, "run", "executor", str, "threads"),
                                           _get(rn, "run", "ray_address", str, None))

    return Scenario(
        name=name,
        description=_get(data, "", "description", str, ""),
        workload=workload,
        array=check_choice("workload.array", _get(wl, "workload", "array", str, "auto"), ARRAYS),
        params=params,
        store=store,
        modes=tuple(check_choices("receiver.modes", _get(rc, "receiver", "modes", list, ["at_least_once"]), RECEIVER_MODES)),
        backends=tuple(check_choices("pipeline.backends", _get(pl, "pipeline", "backends", list, ["criu"]), CHECKPOINTERS.names())),
        faults=tuple(check_choices("pipeline.faults", _get(pl, "pipeline", "faults", list, ["kill"]), FAULTS)),
        crash_after_ms=_ms("pipeline.crash_after_ms", _get(pl, "pipeline", "crash_after_ms", (list, int, float), [100.0])),
        split_window_ms=_ms("pipeline.split_window_ms", _get(pl, "pipeline", "split_window_ms", (list, int, float), [0.0])),
        rank_skew_ms=_ms("pipeline.rank_skew_ms", _get(pl, "pipeline", "rank_skew_ms", (list, int, float), [0.0])),
        restore_targets=tuple(check_choices("pipeline.restore_targets", _get(pl, "pipeline", "restore_targets", list, ["same"]), RESTORE_TARGETS)),
        certify=tuple(check_choices("pipeline.certify", _as_list(_get(pl, "pipeline", "certify", (list, str), ["off"])), CERTIFY_MODES)),
        keep_images=_get(pl, "pipeline", "keep_images", bool, False),
        images_dir=_get(pl, "pipeline", "images_dir", str, "/dev/shm"),
        support_matrix=_get(pl, "pipeline", "support_matrix", str, ""),
        skip_unavailable=_get(pl, "pipeline", "skip_unavailable", bool, False),
        plan_source=check_choice("plan.source", _get(pn, "plan", "source", str, "exhaustive"), PLAN_SOURCES),
        plan_ops=(plan_ops[0], plan_ops[1]),
        plan_phases=tuple(phases),
        trials=_bounded("plan.trials", _get(pn, "plan", "trials", int, 10)),
        seed=_get(pn, "plan", "seed", int, 0),
        cuts_per_trial=_bounded("plan.cuts_per_trial", _get(pn, "plan", "cuts_per_trial", int, 1)),
        interval_ops=check_range("plan.interval_ops", _get(pn, "plan", "interval_ops", int, 0), 0, LIMITS["plan.ops"]),
        cut_mode=check_choice("plan.cut_mode", _get(pn, "plan", "cut_mode", str, "precise"), ("precise", "async", "mixed")),
        async_offset_ms=_ms("plan.async_offset_ms", _get(pn, "plan", "async_offset_ms", (list, int, float), [0.0])),
        profile=check_choice("plan.profile", _get(pn, "plan", "profile", str, "ci"), PROFILES),
        watchdog_s=float(_bounded("run.watchdog_s", _get(rn, "run", "watchdog_s", (int, float), 20.0))),
        trial_timeout_s=float(_bounded("run.trial_timeout_s", _get(rn, "run", "trial_timeout_s", (int, float), 120.0))),
        stage_timeout_s=float(_bounded("run.stage_timeout_s", _get(rn, "run", "stage_timeout_s", (int, float), 60.0))),
        prepare_timeout_s=float(_bounded("run.prepare_timeout_s", _get(rn, "run", "prepare_timeout_s", (int, float), 5.0))),
        # Under Ray, as many trials at once as its resources hold unless run.jobs caps them.
        jobs=check_jobs("run.jobs", rn.get("jobs", "auto" if executor == "ray" else 1)),
        trials_per_gpu=_bounded("run.trials_per_gpu", _get(rn, "run", "trials_per_gpu", int, 1)),
        executor=executor,
        ray_address=ray_address,
        source_path=source_path,
        variants=variants,
    )


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
        if isinstance(table.get("receiver"), dict) and "store" in table["receiver"]:
            raise InvalidArgument(f"{where}.receiver.store: a run has one receiver store; set it at the top level")
        for key in ("jobs", "trials_per_gpu", "executor", "ray_address"):
            if isinstance(table.get("run"), dict) and key in table["run"]:
                option = "--jobs" if key in ("jobs", "trials_per_gpu") else f"--{key.replace('_', '-')}"
                raise InvalidArgument(f"{where}.run.{key}: a run has one pool of trials running at once; "
                                      f"set run.{key} at the top level (or pass {option})")
        merged = copy.deepcopy(base)
        _deep_merge(merged, copy.deepcopy({k: v for k, v in table.items() if k != "name"}))
        for item in overrides:
            _apply_override(merged, item)
        try:
            sub = parse_scenario(merged, source_path)
        except InvalidArgument as exc:
            raise InvalidArgument(f"{where} ({name}): {exc}") from None
        if sub.plan_source == "hypothesis":
            raise InvalidArgument(f"{where} ({name}): plan.source = 'hypothesis' is adaptive; variants run exhaustive or random plans")
        out.append(replace(sub, variant=name))
    return tuple(out)


def parse_jobs(where: str, text: str) -> int | str:
    """A command line's ``N|auto`` (``--jobs``, ``--cutbench-jobs``) checked as :func:`check_jobs` checks ``run.jobs``."""
    return check_jobs(where, int(text) if text.strip().isdigit() else text)


def check_jobs(where: str, value: Any) -> int | str:
    """``value`` as a number of trials to run at once: an integer from 1 to ``LIMITS["run.jobs"]``, or "auto".

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
    """``(run.executor, run.ray_address)`` checked together; return them (the address "" when absent).

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
    """``value`` as the TOML text an override (``section.key=TEXT``) reads back as ``value``."""
    return tomli_w.dumps({"v": value}).split("=", 1)[1].strip()


def _apply_override(data: dict[str, Any], item: str) -> None:
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
    allowed = _SECTIONS[section]
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


def _get(table: dict[str, Any], section: str, key: str, types: Any, default: Any) -> Any:
    """``table[key]`` checked against ``types``, or ``default`` when absent."""
    if key not in table:
        return default
    return check_type(f"{section}.{key}" if section else key, table[key], types)


def _validate_workload(name: str, params: dict[str, Any]) -> dict[str, Any]:
    from cutbench.workloads import api

    try:
        cls = api.load(name)
        return api.resolve_params(cls, params)
    except api.WorkloadError as exc:
        field_name = "workload.name" if "unknown workload" in str(exc) or "cannot import" in str(exc) else "workload.params"
        raise InvalidArgument(f"{field_name}: {exc}") from None


def _workload_phases(name: str) -> tuple[str, ...]:
    from cutbench.workloads import api

    return tuple(api.load(name).phases)


def _as_list(value: Any) -> list[Any]:
    """A scalar field that may also be a list of values (``certify = "audit"`` or ``["audit", "enforce"]``)."""
    return value if isinstance(value, list) else [value]


def _bounded(where: str, value: Any) -> Any:
    """``value`` if it is > 0 and at most the field's :data:`LIMITS` entry."""
    check_positive(where, value)
    return check_range(where, value, high=LIMITS[where])


def _ms(where: str, value: Any) -> tuple[float, ...]:
    """A number or list of numbers of milliseconds, each in 0..``LIMITS["pipeline.ms"]`` (an hour)."""
    values = check_numbers(where, value)
    for v in values:
        check_range(where, v, 0, LIMITS["pipeline.ms"])
    return values
