"""The scenario schema: every field of a scenario file, declared once.

Each :class:`Field` names its table and key, the TOML type it takes, its
default, its bounds or allowed values and a one-line help. Everything else
reads it: the parser (``harness/model/scenario.py``) takes its defaults, type
checks and bounds from :func:`check`; ``Scenario``, ``TrialSpec``,
``CutContext``, the gate's ``run_trial`` and the support matrix's scenario
take their defaults from :func:`default`; and ``python -m
cutbench.harness.model.schema --markdown`` prints the reference tables that
``scenarios/README.md`` holds (``tests/unit/test_scenario_schema.py`` keeps
the two equal).

What it must not do: check one field against another (the plan's ops against
the workload's, the Ray address against the executor) or look a workload up;
that is the parser's. It imports only the ground floor, the workloads' array
list and the model's vocabularies, so every room may import it.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cutbench.harness.model.boundaries import CALLS, DEFAULT_CALLS
from cutbench.harness.model.certificate import CERTIFY_MODES, CERTIFY_OFF
from cutbench.harness.model.plan import FAULTS, RESTORE_TARGETS, SAME_GPU
from cutbench.registry import CHECKPOINTERS
from cutbench.validate import (check_choice, check_choices, check_numbers, check_option_lists, check_positive,
                               check_range, check_type)
from cutbench.workloads.xp import ARRAY_BACKENDS

RECEIVER_MODES: tuple[str, ...] = ("at_least_once", "idempotent", "fenced")
PLAN_SOURCES: tuple[str, ...] = ("exhaustive", "random", "hypothesis", "periodic")
EXECUTORS: tuple[str, ...] = ("threads", "ray", "slurm")  # what runs a run's trials (run.executor)
PROFILES: tuple[str, ...] = ("ci", "research")  # of the hypothesis source (cutbench.harness.generator.search)
ARRAYS: tuple[str, ...] = ARRAY_BACKENDS  # the workloads' runtime decides which array libraries exist

# CRIU options every cut sets as it needs them (docs/criu.md, "What CRIU does here"): pipeline.criu_options refuses them.
CRIU_OWN_OPTIONS: tuple[str, ...] = (
    "--tree", "--images-dir", "--log-file", "--pidfile", "--restore-detached", "--leave-running", "--tcp-established",
    "--tcp-close", "--network-lock", "--inherit-fd", "--shell-job", "--skip-in-flight", "--libdir", "--work-dir")

# Upper bounds, so that a typo cannot exhaust memory or time in planning before the first trial.
MAX_OPS = 1_000_000  # plan.ops and plan.interval_ops
MAX_MS = 3_600_000  # every millisecond list: an hour
EXHAUSTIVE_PLANS = 1_000_000  # plans per arm of the exhaustive source, counted before they are enumerated
PERIODIC_CUTS = 10_000  # cuts in the periodic source's one plan
MAX_JOBS = 1024  # trials run at once
MAX_S = 86_400  # a time limit: a day

# What a field's value is, which decides how :func:`check` reads it and how the table shows its type.
TEXT = "text"  # a string
FLAG = "flag"  # true or false
INTEGER = "integer"
NUMBER = "number"  # an integer or a float, stored as a float
CHOICE = "choice"  # one string of ``choices``
CHOICES = "choices"  # a list of strings of ``choices`` (repeats dropped), stored as a tuple
MS = "ms"  # a number of milliseconds or a list of them, stored as a tuple of floats
MAPPING = "mapping"  # an inline table of free keys (the workload's parameters)
TABLE = "table"  # a top-level table: its fields are those whose section is its name
CUSTOM = "custom"  # a form of its own: :func:`check` tests the type only, the parser the rest
OPTION_LISTS = "option lists"  # a tool's options: one list, or a list of lists (one arm each), a tuple of tuples

_TYPES: dict[str, tuple[type, ...]] = {
    TEXT: (str,), FLAG: (bool,), INTEGER: (int,), NUMBER: (int, float), CHOICE: (str,), CHOICES: (list,),
    MS: (list, int, float), MAPPING: (dict,), TABLE: (dict,),
}


@dataclass(frozen=True)
class Field:
    """One scenario field: where it sits, what it takes, its default and what it means.

    ``default`` is the value a :class:`~cutbench.harness.model.scenario.Scenario`
    holds when the file leaves the field out (a tuple for a list, a float for
    a number); None where the parser computes it. ``attr`` is the Scenario
    attribute the field fills ("" for a field the parser or the file loader
    consumes). ``help`` is one line of Markdown, links relative to
    ``scenarios/``; ``{choices}`` in it stands for the allowed values, each
    with its entry of ``meanings``.
    """

    section: str  # "" for the top level, else the table: "workload", "receiver", "pipeline", "plan", "run"
    name: str
    kind: str
    default: Any
    help: str
    attr: str = ""
    choices: tuple[str, ...] | Callable[[], tuple[str, ...]] = ()  # a callable for a registry, asked at each check
    meanings: dict[str, str] = field(default_factory=dict)
    low: int | float | None = None  # inclusive bounds (of each element, for a list)
    high: int | float | None = None
    positive: bool = False  # > 0, checked before the bounds (its own message)
    types: tuple[type, ...] = ()  # the TOML types taken; () for the kind's
    type_text: str = ""  # the table's type column, where the kind's does not say it
    default_text: str = ""  # the table's default column, where the value does not say it
    arm: bool = False  # an axis of the arm product (Scenario.arms): a sweep over it widens the arms, makes no variants
    per_run: bool = False  # one value for the whole run (one session): no variant sets it, no sweep varies it

    @property
    def key(self) -> str:
        """The dotted name errors, ``--set`` and the tables use: ``run.watchdog_s`` (``name`` at the top level)."""
        return f"{self.section}.{self.name}" if self.section else self.name

    def allowed(self) -> tuple[str, ...]:
        """The values a choice field takes now (a registry's names are asked for on each call)."""
        return self.choices() if callable(self.choices) else self.choices

    def accepts(self) -> tuple[type, ...]:
        """The TOML types the field takes; () when the parser checks the type itself."""
        return self.types or _TYPES.get(self.kind, ())


def _meaning(values: tuple[str, ...], meanings: dict[str, str]) -> str:
    """``values`` as a Markdown list in prose: "`kill` (dump, kill, restore), `none`"."""
    return ", ".join(f"`{v}` ({meanings[v]})" if meanings.get(v) else f"`{v}`" for v in values)


FIELDS: tuple[Field, ...] = (
    # The order within a table is that of the allowed keys an unknown-field error lists (kept as it was
    # when each table had its own key list), of the reference tables, and in which the parser checks them.
    # -- the top level
    Field("", "name", TEXT, None, "names the run (`results/<time>-<name>-<hex>/`) and the gate's test ids",
          attr="name", default_text="the file's stem (`scenario` without a file)"),
    Field("", "description", TEXT, "", "free text, shown in the summary and the report", attr="description"),
    Field("", "include", CUSTOM, None,
          "other scenario files (relative to this one) merged first, in order; this file's tables win key by key, "
          "and its `[[variants]]` are added after the included ones; cycles are an error",
          types=(str, list), type_text="string or list"),
    Field("", "workload", TABLE, None, "What runs: the workload, the array library it computes with, its parameters."),
    Field("", "receiver", TABLE, None, "Where the workload's effects go: the store, and the delivery modes to compare."),
    Field("", "pipeline", TABLE, None,
          "How each cut is taken: the checkpoint tools, the faults, the delays around them, the certificates."),
    Field("", "plan", TABLE, None, "Where the cuts fall: the plan source and the cut points it chooses from."),
    Field("", "run", TABLE, None, "The time limits, and how many trials run at once, where."),
    Field("", "variants", CUSTOM, None,
          "`[[variants]]`: named overlays, each merged over the rest of the file (tables `workload`, `receiver` "
          "except `store`, `pipeline`, `plan`, `run`, and `name`); a run runs every variant instead of the base, and "
          "trials carry the variant's name (`variant` column). The plan source must be static (`exhaustive` or "
          "`random`)", types=(list,), type_text="array of tables"),
    # -- [workload]
    Field("workload", "name", TEXT, "counter", "a registered workload: `cutbench list workloads`", attr="workload"),
    Field("workload", "array", CHOICE, "auto", "{choices}", attr="array", choices=ARRAYS, meanings={
        "auto": "CuPy when a GPU is usable and the workload runs on it, else NumPy",
        "torch": "CUDA tensors through `array_api_compat.torch`; a workload must list `\"torch\"` in its `arrays`, and "
                 "on a machine without PyTorch or a GPU its arms are skipped with the reason"}),
    Field("workload", "params", MAPPING, {},
          "the workload's parameters ([the common ones](#workload-parameters)); unknown keys and wrong types are "
          "errors, and the message lists the allowed keys. Missing keys take the workload's defaults", attr="params"),
    # -- [receiver]
    Field("receiver", "store", TEXT, "sqlite",
          "`sqlite` (a file in the run's work directory), `sqlite:PATH`, or a `postgresql://` URL. One store per run: "
          "it cannot be a sweep axis or differ between variants", attr="store", per_run=True),
    Field("receiver", "modes", CHOICES, ("at_least_once",), "any of {choices}", attr="modes", choices=RECEIVER_MODES,
          meanings={"at_least_once": "every delivery applied: duplicates visible",
                    "idempotent": "applied once per op; later deliveries recorded as suppressed",
                    "fenced": "prepare, then commit only up to the checkpoint's fence"}, arm=True),
    # -- [pipeline]
    Field("pipeline", "backends", CHOICES, ("criu",),
          "any registered backend: the built-ins of `harness/nemesis/backends/` and those plug-ins add (`cutbench list "
          "backends` lists them and says which run here)", attr="backends", choices=CHECKPOINTERS.names, arm=True),
    Field("pipeline", "faults", CHOICES, ("kill",),
          "any of {choices}. A backend that cannot do a fault skips that arm with the reason", attr="faults",
          choices=FAULTS, meanings={"kill": "dump, kill, restore",
                                    "leave_running": "dump, let it run `crash_after_ms`, crash, restore",
                                    "none": "suspend and resume in place"}, arm=True),
    Field("pipeline", "crash_after_ms", MS, (100.0,),
          "for `leave_running`: how long the original runs on after the dump before it is crashed",
          attr="crash_after_ms", low=0, high=MAX_MS, arm=True),
    Field("pipeline", "split_window_ms", MS, (0.0,),
          "for backends with a split window (`cuda+criu`): delay between the CUDA checkpoint and the CRIU dump, in "
          "which host code still runs", attr="split_window_ms", low=0, high=MAX_MS, arm=True),
    Field("pipeline", "keep_images", FLAG, False,
          "keep checkpoint image directories after each cut (debugging; they can be large)", attr="keep_images"),
    Field("pipeline", "images_dir", TEXT, "/dev/shm",
          "where image directories are made (`cutbench-<run>-<trial>-c<cut>`)", attr="images_dir"),
    Field("pipeline", "expect_refusals", FLAG, False,
          "`true`: a run whose every cut is refused is the answer sought (a tool that must decline, e.g. `certify = "
          "\"enforce\"` on cuts it cannot certify); `false`: such a run tested nothing, so it exits 2 and fails the gate",
          attr="expect_refusals"),
    Field("pipeline", "skip_unavailable", FLAG, False,
          "`true`: arms whose backend cannot run here are skipped and listed in the summary; `false`: the run refuses "
          "to start (exit 254) and says why", attr="skip_unavailable"),
    Field("pipeline", "rank_skew_ms", MS, (0.0,),
          "for CUDA backends and multi-process workloads: 0 cuts all ranks together (coordinated); > 0 cuts them one "
          "at a time this far apart", attr="rank_skew_ms", low=0, high=MAX_MS, arm=True),
    Field("pipeline", "restore_targets", CHOICES, (SAME_GPU,), "for CUDA backends: any of {choices}",
          attr="restore_targets", choices=RESTORE_TARGETS,
          meanings={SAME_GPU: "the GPU it ran on", "other_gpu": "restore remapped to another GPU"}, arm=True),
    Field("pipeline", "certify", CHOICES, (CERTIFY_OFF,),
          "recovery-cut certificates, an arm axis: {choices}; see [docs/certificates.md](../docs/certificates.md)",
          attr="certify", choices=CERTIFY_MODES, types=(list, str), type_text="string or list",
          meanings={"audit": "certify, restore anyway", "enforce": "refuse ineligible cuts"}, arm=True),
    Field("pipeline", "criu_options", OPTION_LISTS, ((),),
          "CRIU's own options, an arm axis: a list of options (`[\"--file-locks\"]`), or a list of such lists, one arm "
          "each (`[[], [\"--file-locks\"]]`: with and without, side by side). Each `--name` or `--name=value`; they go to "
          "every CRIU a backend runs (`criu`, `criu-cuda-plugin`, under the GPU tools, and Docker's and Podman's CRIU "
          "options files), at dump and restore; a backend that runs no CRIU has one arm without them. The options a cut "
          "sets itself (`--tcp-established`, `--leave-running`, …) are refused",
          attr="criu_options", type_text="list, or list of lists", default_text="`[[]]` (none)", arm=True),
    Field("pipeline", "support_matrix", TEXT, "",
          "a measured CUDA support matrix (a `cutbench matrix` run directory or its `matrix.parquet`, path relative to "
          "where cutbench runs): certificates ask it about every CUDA feature the workload declares; a restore using a "
          "feature not `identical` for this tool, fault and driver is ineligible. A path that holds no matrix is "
          "refused before the run starts (exit 254). See [docs/matrix.md](../docs/matrix.md)", attr="support_matrix"),
    # -- [plan]
    Field("plan", "source", CHOICE, "exhaustive", "{choices}", attr="plan_source", choices=PLAN_SOURCES, meanings={
        "exhaustive": f"every allowed cut point, bounded black-box; at most {EXHAUSTIVE_PLANS:,} plans per arm, "
                      "counted before they are enumerated",
        "random": "`trials` seeded plans per arm",
        "hypothesis": "adaptive search with shrinking; writes `search.json`",
        "periodic": "a cut every `interval_ops` ops: periodic checkpoints, for the steady-state overhead"}),
    Field("plan", "ops", CUSTOM, (1, 1),
          "the operations cuts may fall in; `1 ≤ first ≤ last ≤ workload.params.ops`", attr="plan_ops",
          low=1, high=MAX_OPS, types=(list,), type_text=f"`[first, last]`, each 1–{MAX_OPS:,}", default_text="`[1, 1]`"),
    Field("plan", "phases", CUSTOM, "all",
          "the phases cuts may follow, from the workload's own phases (`admit`, `launch`, `device_done`, `record`, "
          "`publish`, `ack`, `commit`, and workload-specific ones such as `send`, `outbox`, `collective`)",
          attr="plan_phases", types=(list, str), type_text="`\"all\"` or list"),
    Field("plan", "trials", INTEGER, 10,
          "`random`: plans per arm; `hypothesis`: examples per arm; `periodic`: repeats of its one plan per arm",
          attr="trials", positive=True, high=1_000_000),
    Field("plan", "seed", INTEGER, 0,
          "seeds `random` and the `ci` profile of `hypothesis`; each arm mixes in its label, so adding an arm leaves "
          "the others' plans unchanged", attr="seed"),
    Field("plan", "cuts_per_trial", INTEGER, 1,
          "the most cuts in one plan: `exhaustive` enumerates every plan of 1 to this many cuts over increasing "
          "positions (the count grows as positions^cuts: keep `ops` small); `random` and `hypothesis` draw plans of "
          "up to this many", attr="cuts_per_trial", positive=True, high=8),
    Field("plan", "cut_mode", CHOICE, "precise", "{choices}", attr="cut_mode", choices=("precise", "async", "mixed"),
          meanings={"precise": "park the workload at the cut point",
                    "async": "start the pipeline `async_offset_ms` after the point, wherever the workload then is",
                    "mixed": "both"}),
    Field("plan", "async_offset_ms", MS, (0.0,), "offsets for `async` cuts", attr="async_offset_ms", low=0, high=MAX_MS),
    Field("plan", "syscalls", CHOICES, DEFAULT_CALLS,
          "for a program's cuts of phase `syscall`: the system calls that count, any of {choices}. A call counts on its "
          "stdout or stderr, a socket, a file within its directory, and `exit_group` of its own process; a cut at op k "
          "lands just before its k-th counted call. See [docs/programs.md](../docs/programs.md)",
          attr="syscalls", choices=tuple(CALLS), default_text="every one of them"),
    Field("plan", "profile", CHOICE, "ci", "`hypothesis` only: {choices}", attr="profile", choices=PROFILES, meanings={
        "ci": "seeded, no shrinking, stops at the first failure",
        "research": "random, shrinking, example database under the run"}),
    Field("plan", "interval_ops", INTEGER, 0,
          f"`periodic` only: a precise cut at the first of `phases` every this many ops over `ops` (at most "
          f"{PERIODIC_CUTS:,} cuts); `0` places no cut (the native run the overhead is measured against)",
          attr="interval_ops", low=0, high=MAX_OPS),
    # -- [run]
    Field("run", "watchdog_s", NUMBER, 20.0, "no progress for this long after a restore is a `deadlock` finding",
          attr="watchdog_s", positive=True, high=MAX_S),
    Field("run", "trial_timeout_s", NUMBER, 120.0,
          "a trial still running after this is stopped and its outcome is `unknown`",
          attr="trial_timeout_s", positive=True, high=MAX_S),
    Field("run", "stage_timeout_s", NUMBER, 60.0, "limit for one pipeline stage and for reaching a cut point",
          attr="stage_timeout_s", positive=True, high=MAX_S),
    Field("run", "prepare_timeout_s", NUMBER, 5.0,
          "how long the workload's semantic adapters have to join a cut (`prepare`) before it is called off "
          "([certificates](../docs/certificates.md#semantic-adapters))", attr="prepare_timeout_s", positive=True,
          high=3_600),
    Field("run", "stop_at_first_invalid", FLAG, False,
          "`true`: the run stops after its first `invalid` trial, its trials run one at a time in plan order in "
          "this process (not `jobs` at once, not under Ray; `run.toml`'s `first_invalid` is that trial's number: "
          "the trials to the first failure); the "
          "`hypothesis` source stops each arm at its own first failure already", attr="stop_at_first_invalid",
          per_run=True),
    Field("run", "jobs", CUSTOM, 1,
          "trials run at once (`--jobs` wins); `auto`: one per CPU, or `trials_per_gpu` per GPU on a GPU host. "
          "Verdicts are those of a serial run; not per variant", attr="jobs", low=1, high=MAX_JOBS,
          type_text=f"integer 1–{MAX_JOBS:,} or `\"auto\"`", default_text="`1`; `\"auto\"` under `executor = \"ray\"` or `\"slurm\"`", per_run=True),
    Field("run", "trials_per_gpu", INTEGER, 1, "how many trials share one GPU when `jobs = \"auto\"` or under Ray",
          attr="trials_per_gpu", positive=True, high=64, per_run=True),
    Field("run", "executor", CHOICE, "threads", "where parallel trials run (`--executor`): {choices}", attr="executor",
          choices=EXECUTORS, meanings={"threads": "worker threads of this process",
                                       "ray": "Ray tasks; `pip install 'cutbench[ray]'`",
                                       "slurm": "a Slurm job array on a cluster whose nodes are this machine "
                                                "([docs/slurm.md](../docs/slurm.md))"}, per_run=True),
    Field("run", "ray_address", TEXT, "",
          "`executor = \"ray\"` only: a running Ray to join (`--ray-address`), `HOST:PORT` or `auto`; without it a "
          "local Ray is started", attr="ray_address", default_text="none", per_run=True),
)

_BY_KEY: dict[str, Field] = {f.key: f for f in FIELDS}
SECTIONS: tuple[str, ...] = tuple(f.name for f in FIELDS if f.kind == TABLE)

# The numeric bounds by key, for the checks that are not one field's (plans per arm, cuts per plan, every
# millisecond list) and for the callers that name a bound in a message or a test.
LIMITS: dict[str, int | float] = {
    **{f.key: f.high for f in FIELDS if f.high is not None and f.kind != MS},
    "plan.exhaustive_plans": EXHAUSTIVE_PLANS,
    "plan.periodic_cuts": PERIODIC_CUTS,
    "pipeline.ms": MAX_MS,
}


def lookup(key: str) -> Field:
    """The :class:`Field` named ``key`` (``run.watchdog_s``, ``name``); KeyError for a field that does not exist."""
    return _BY_KEY[key]


def default(key: str) -> Any:
    """The default of field ``key`` as a ``Scenario`` holds it (``20.0`` for ``run.watchdog_s``, ``("criu",)``
    for ``pipeline.backends``); KeyError for a field that does not exist."""
    return _BY_KEY[key].default


def arm_keys() -> frozenset[str]:
    """The dotted keys of the fields that are axes of the arm product."""
    return frozenset(f.key for f in FIELDS if f.arm)


def per_run_keys() -> frozenset[str]:
    """The dotted keys of the fields a run has one value of (no variant sets them, no sweep varies them)."""
    return frozenset(f.key for f in FIELDS if f.per_run)


def keys(section: str) -> tuple[str, ...]:
    """The keys table ``section`` allows ("" for the top level), in declaration order."""
    return tuple(f.name for f in FIELDS if f.section == section)


def fields_of(section: str) -> tuple[Field, ...]:
    """The fields of table ``section`` ("" for the top level), in declaration order."""
    return tuple(f for f in FIELDS if f.section == section)


def check(f: Field, value: Any) -> Any:
    """Return ``value`` given for field ``f``, checked and converted to what a ``Scenario`` holds.

    Raises :class:`~cutbench.errors.InvalidArgument` naming the field, the bad
    value and what is allowed. A ``CUSTOM`` field gets its type checked only
    (the parser checks the rest).
    """
    where = f.key
    if f.accepts():
        check_type(where, value, f.accepts())
    if f.kind == CHOICE:
        return check_choice(where, value, f.allowed())
    if f.kind == CHOICES:
        # A field that also takes a string (certify = "audit") reads it as a list of one.
        return tuple(check_choices(where, value if isinstance(value, list) else [value], f.allowed()))
    if f.kind == MS:
        values = check_numbers(where, value)
        for v in values:
            check_range(where, v, f.low, f.high)
        return values
    if f.kind == OPTION_LISTS:
        return check_option_lists(where, value, CRIU_OWN_OPTIONS)
    if f.kind in (INTEGER, NUMBER):
        if f.positive:
            check_positive(where, value)
        if f.low is not None or f.high is not None:
            check_range(where, value, f.low, f.high)
        return float(value) if f.kind == NUMBER else value
    return value


# -- the reference tables ----------------------------------------------------


def _literal(value: Any) -> str:
    """``value`` as a scenario file writes it (``[100]``, ``"criu"``, ``false``)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(_literal(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {_literal(v)}" for k, v in value.items()) + "}"
    if isinstance(value, str):
        return json.dumps(value)
    return str(value)


def _bounds(f: Field) -> str:
    """``f``'s bounds as the type column says them: "1–8", "> 0, ≤ 86,400", or "" for none."""
    low = 1 if f.positive and f.kind == INTEGER else f.low
    if low is not None and f.high is not None:
        return f"{low:,}–{f.high:,}"
    if f.positive:
        return "> 0" + (f", ≤ {f.high:,}" if f.high is not None else "")
    return f"≥ {low:,}" if low is not None else (f"≤ {f.high:,}" if f.high is not None else "")


def type_text(f: Field) -> str:
    """The reference table's type column for ``f``: its kind and its bounds (``integer 1–8``)."""
    if f.type_text:
        return f.type_text
    bounds = _bounds(f)
    if f.kind == MS:
        return f"number or list, each {bounds}"
    base = {TEXT: "string", FLAG: "bool", INTEGER: "integer", NUMBER: "number", CHOICE: "string", CHOICES: "list",
            MAPPING: "table"}[f.kind]
    return f"{base} {bounds}" if bounds else base


def default_text(f: Field) -> str:
    """The reference table's default column for ``f``: the value as a file writes it, in code quotes."""
    if f.default_text:
        return f.default_text
    return "none" if f.default is None else f"`{_literal(f.default)}`"


def help_text(f: Field) -> str:
    """Return ``f.help`` with ``{choices}`` spelled out: each allowed value, with its meaning where it has one."""
    if "{choices}" not in f.help:
        return f.help
    return f.help.replace("{choices}", _meaning(f.allowed(), f.meanings))


def markdown() -> str:
    """The reference tables of ``scenarios/README.md``: the top level, then one section per table, as Markdown."""
    out: list[str] = []

    def table(rows: tuple[Field, ...]) -> None:
        out.append("| field | type | default | meaning |")
        out.append("|---|---|---|---|")
        out.extend(f"| `{f.name}` | {type_text(f)} | {default_text(f)} | {help_text(f)} |" for f in rows)
        out.append("")

    out += ["## Top level", ""]
    table(tuple(f for f in fields_of("") if f.kind != TABLE))
    for section in SECTIONS:
        out += [f"## `[{section}]`", "", lookup(section).help, ""]
        table(fields_of(section))
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    """Run ``python -m cutbench.harness.model.schema --markdown``: print the reference tables; return the exit status."""
    parser = argparse.ArgumentParser(prog="python -m cutbench.harness.model.schema",
                                     description="The scenario schema (harness/model/schema.py).")
    parser.add_argument("--markdown", action="store_true", required=True,
                        help="print the reference tables of scenarios/README.md")
    parser.parse_args(argv)
    sys.stdout.write(markdown())
    return 0


if __name__ == "__main__":
    sys.exit(main())
