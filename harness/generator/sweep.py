"""Sweeps: one scenario at every point of a cartesian product of axes, in one run.

An axis is ``FIELD=V1,V2`` (or ``FIELD=[V1, V2]`` in TOML array syntax, for
values that are themselves lists) naming any scenario field as ``--set``
does. Axes over the fields that already make arms (those the schema marks
``arm``: ``pipeline.backends``, ``receiver.modes``, ``pipeline.faults``, the
crash, split-window and rank-skew delays, restore targets and ``certify``)
widen the scenario's own arm product; every
other axis makes *variants* — one resolved scenario per combination — whose
trials carry a ``variant`` label such as ``state_size=4096,seed=1``. All
variants run in one session against one receiver and land in one run
directory, grouped by variant and arm in the summary and the report.
"""

from __future__ import annotations

import itertools
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cutbench.errors import InvalidArgument
from cutbench.harness.generator.scheduler import build_specs
from cutbench.harness.model import schema
from cutbench.harness.model.scenario import Scenario, load_scenario, toml_value

ARM_AXES = schema.arm_keys()
# Fields one session cannot vary: the run's own (its receiver store, its pool of trials) and the file's.
FIXED = schema.per_run_keys() | {"name", "include", "description"}


@dataclass(frozen=True)
class Axis:
    """One sweep axis: a dotted scenario field and the values it takes."""

    key: str
    values: tuple[Any, ...]


@dataclass(frozen=True)
class SweepPoint:
    """One combination of the variant axes: its label, the overrides that make it, the resolved scenario."""

    variant: str
    overrides: tuple[str, ...]
    scenario: Scenario


def _scalar(raw: str) -> Any:
    try:
        return tomllib.loads(f"v = {raw.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        return raw.strip()  # a bare word is a string, as in --set


def parse_axis(text: str) -> Axis:
    """Parse ``FIELD=V1,V2`` or ``FIELD=[V1, V2]``; raise InvalidArgument naming what is wrong."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key or not raw.strip():
        raise InvalidArgument(f"--axis {text!r}: expected FIELD=V1,V2 (e.g. workload.params.state_size=4096,65536)")
    if key in FIXED or key.split(".")[0] in FIXED:
        raise InvalidArgument(f"--axis {key}: cannot be swept in one run; allowed: any scenario field except {', '.join(sorted(FIXED))}")
    raw = raw.strip()
    values: list[Any]
    if raw.startswith("["):
        try:
            parsed = tomllib.loads(f"v = {raw}")["v"]
        except tomllib.TOMLDecodeError as exc:
            raise InvalidArgument(f"--axis {key}: {raw!r} is not a TOML array ({exc})") from None
        values = list(parsed)
    else:
        values = [_scalar(part) for part in raw.split(",") if part.strip()]
    if not values:
        raise InvalidArgument(f"--axis {key}: no values given")
    unique = list(dict.fromkeys(toml_value(v) for v in values))
    if len(unique) != len(values):
        raise InvalidArgument(f"--axis {key}: values repeat ({raw})")
    return Axis(key, tuple(values))


def _labels(axes: list[Axis]) -> list[str]:
    short = [a.key.rsplit(".", 1)[-1] for a in axes]
    return [s if short.count(s) == 1 else a.key for s, a in zip(short, axes)]


def expand(path: str | Path, axes: list[Axis], overrides: list[str] | None = None) -> list[SweepPoint]:
    """Every point of the sweep, each a validated scenario (raise InvalidArgument on the first bad one)."""
    keys = [a.key for a in axes]
    if len(set(keys)) != len(keys):
        raise InvalidArgument(f"--axis: a field is given twice ({', '.join(k for k in keys if keys.count(k) > 1)})")
    base = list(overrides or [])
    base += [f"{a.key}={toml_value(list(a.values))}" for a in axes if a.key in ARM_AXES]
    variant_axes = [a for a in axes if a.key not in ARM_AXES]
    labels = _labels(variant_axes)
    points = []
    for combo in itertools.product(*(a.values for a in variant_axes)):
        extra = [f"{a.key}={toml_value(v)}" for a, v in zip(variant_axes, combo)]
        try:
            scenario = load_scenario(path, base + extra)
        except InvalidArgument as exc:
            where = ", ".join(extra) or "the scenario"
            raise InvalidArgument(f"sweep point {where}: {exc}") from None
        variant = ",".join(f"{label}={toml_value(v)}".replace('"', "") for label, v in zip(labels, combo))
        points.append(SweepPoint(variant, tuple(base + extra), scenario))
    first = points[0].scenario
    if first.plan_source == "hypothesis":
        raise InvalidArgument("plan.source = 'hypothesis': a sweep runs static plans; use exhaustive or random")
    return points


def plan_points(path: str | Path, axes: list[Axis], overrides: list[str] | None = None) -> list[dict[str, Any]]:
    """Return each point of the sweep as ``{"variant", "arms", "trials"}`` (what ``sweep --dry-run`` lists).

    A scenario's own ``[[variants]]`` run at every point and count there; the
    base point is labelled ``(base)``. Runs nothing.
    """
    points: list[dict[str, Any]] = []
    for point in expand(path, axes, overrides):
        subs = point.scenario.variants or (point.scenario,)
        points.append({"variant": point.variant or "(base)", "arms": sum(len(s.arms()) for s in subs),
                       "trials": sum(len(build_specs(s, s.arms())) for s in subs)})
    return points
