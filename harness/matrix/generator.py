"""The support matrix's plan: which probe rows through which tools under which faults. Pure.

The rows are the ones the registered probe workloads declare (``matrix_rows``); the tools are
registered backends; each grid point is one trial with one precise cut at the row's cut point, under
the ``idempotent`` receiver (a resend is not the question here). The plan is an ordinary scenario with
one ``[[variants]]`` entry per row, so the run, its store, its report and ``cutbench replay`` are
those of any run; :func:`grid` is what ``run.toml``'s ``[matrix]`` table records.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from cutbench.errors import InvalidArgument
from cutbench.harness.matrix.checker import RECEIVER_MODE
from cutbench.harness.model import schema
from cutbench.harness.model.scenario import Scenario, parse_scenario
from cutbench.registry import CHECKPOINTERS
from cutbench.workloads import api as workload_api

FAULTS: tuple[str, ...] = ("none", "kill")
# Backends that are baselines, not checkpoint tools: the application's own save, and a restart from op 1.
BASELINES: tuple[str, ...] = ("app", "restart")


def probe_rows() -> list[tuple[str, type, workload_api.MatrixRow]]:
    """Every registered workload's matrix rows, as (workload name, class, row), in registry order."""
    out = []
    for name, cls in workload_api.loadable().items():
        if isinstance(cls, workload_api.WorkloadError):
            continue  # a plug-in that does not load declares no rows (``cutbench list workloads`` says why)
        out += [(name, cls, row) for row in workload_api.optional(cls, "matrix_rows")]
    return out


def default_tools() -> tuple[str, ...]:
    """Every registered backend but the baselines (:data:`BASELINES`)."""
    return tuple(n for n in CHECKPOINTERS.names() if n not in BASELINES)


def select_rows(names: tuple[str, ...] | list[str] = ()) -> list[tuple[str, type, workload_api.MatrixRow]]:
    """The rows named (a row's name, or a probe workload's name for all its rows; none: every row).

    Raises :class:`InvalidArgument` naming an unknown one and listing what exists.
    """
    rows = probe_rows()
    if not names:
        return rows
    picked: list[tuple[str, type, workload_api.MatrixRow]] = []
    for want in names:
        hits = [r for r in rows if want in (r[2].name, r[0])]
        if not hits:
            known = sorted({r[0] for r in rows} | {r[2].name for r in rows})
            raise InvalidArgument(f"--probe {want!r}: no probe or matrix row of that name; known: {', '.join(known)}")
        picked += [h for h in hits if h not in picked]
    return picked


def check_tools(tools: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """Return ``tools`` checked against the registered backends (default: :func:`default_tools`)."""
    if not tools:
        return default_tools()
    known = CHECKPOINTERS.names()
    for tool in tools:
        if tool not in known:
            raise InvalidArgument(f"--tool {tool!r}: not a registered backend; known: {', '.join(known)}")
    return tuple(dict.fromkeys(tools))


def check_faults(faults: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """Return ``faults`` checked (default :data:`FAULTS`); only ``none`` and ``kill`` belong in the matrix."""
    if not faults:
        return FAULTS
    for fault in faults:
        if fault not in FAULTS:
            raise InvalidArgument(f"--fault {fault!r}: the matrix measures {', '.join(FAULTS)}")
    return tuple(dict.fromkeys(faults))


def grid(rows: list[tuple[str, type, workload_api.MatrixRow]], tools: tuple[str, ...], faults: tuple[str, ...]) -> dict[str, Any]:
    """What ``run.toml``'s ``[matrix]`` table holds: the rows (name, feature, description, probe, array,
    cut, params), the tools and the faults. The rows that need the GPU to themselves come last."""
    ordered = sorted(rows, key=lambda r: bool(workload_api.optional(r[1], "exclusive_gpu")))
    return {"rows": [{"name": row.name, "feature": row.feature, "description": row.description, "probe": probe,
                      "array": row.array, "cut": f"{row.cut_op}/{row.cut_phase}", "params": dict(row.params),
                      "restore_target": row.restore_target,
                      "exclusive_gpu": bool(workload_api.optional(cls, "exclusive_gpu"))} for probe, cls, row in ordered],
            "tools": list(tools), "faults": list(faults)}


def scenario(matrix: dict[str, Any], *, jobs: int | str = schema.default("run.jobs"),
             stage_timeout_s: float = schema.default("run.stage_timeout_s"),
             images_dir: str = schema.default("pipeline.images_dir")) -> Scenario:
    """The scenario that measures ``matrix`` (a :func:`grid`): one variant per row, each arm one trial."""
    variants = []
    for row in matrix["rows"]:
        op, phase = row["cut"].split("/")
        variants.append({
            "name": row["name"],
            "workload": {"name": row["probe"], "array": row["array"], "params": row["params"]},
            "plan": {"ops": [int(op), int(op)], "phases": [phase]},
            "pipeline": {"restore_targets": [row["restore_target"]]},
        })
    doc = {
        "name": "matrix",
        "description": f"CUDA support matrix: {len(matrix['rows'])} probe rows through {', '.join(matrix['tools'])}, "
                       f"faults {', '.join(matrix['faults'])}",
        "workload": {"name": variants[0]["workload"]["name"]},
        "receiver": {"modes": [RECEIVER_MODE]},
        "pipeline": {"backends": matrix["tools"], "faults": matrix["faults"], "skip_unavailable": True,
                     "images_dir": images_dir},
        "plan": {"source": "exhaustive"},
        # A restore of GiBs, a torch.compile in a fresh process: minutes, not the CI defaults.
        "run": {"jobs": jobs, "watchdog_s": 60.0, "trial_timeout_s": 600.0, "stage_timeout_s": stage_timeout_s},
        "variants": variants,
    }
    return parse_scenario(doc, "cutbench matrix")


def describe_rows() -> list[dict[str, Any]]:
    """Every matrix row for ``cutbench matrix --list``: name, feature, probe, array, cut, description."""
    return [{"row": row.name, **{k: v for k, v in asdict(row).items() if k in ("feature", "array", "description")},
             "probe": probe, "cut": f"{row.cut_op}/{row.cut_phase}", "min_gpus": int(workload_api.optional(cls, "min_gpus")),
             "exclusive_gpu": bool(workload_api.optional(cls, "exclusive_gpu"))} for probe, cls, row in probe_rows()]
