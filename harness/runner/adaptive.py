"""Adaptive drivers: run loops that decide the next trial from the last one.

A :data:`Driver` gets ``run_one(spec)`` and the
run directory. ``hypothesis_driver`` hands each arm to the generator's
:func:`~cutbench.harness.generator.search.search_arm` with a ``run_plan``
callback that runs a real trial, and stores the search's progress
(``search.json``) through the run directory.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from cutbench.harness.generator.search import SearchArm, search_arm
from cutbench.harness.model.plan import CutPlan
from cutbench.harness.model.scenario import Arm, Scenario
from cutbench.harness.model.trial import TrialResult, TrialSpec, spec_for
from cutbench.harness.store.rundir import RunDir

# An adaptive source's loop: gets ``run_one(spec) -> TrialResult`` (runs and
# stores one trial) and the run directory; returns extra ``run.toml`` keys.
Driver = Callable[[Callable[[TrialSpec], TrialResult], RunDir], "dict[str, Any] | None"]


def _slug(label: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.+-]+", "_", label)


def hypothesis_driver(scenario: Scenario, sarms: list[SearchArm], *, research_db: bool = True) -> Driver:
    """A :data:`~cutbench.harness.runner.run.Driver` that searches every arm in turn and returns ``{"search": ...}``."""

    def drive(run_one: Callable[[TrialSpec], TrialResult], run: RunDir) -> dict[str, Any]:
        counter = [0]
        results = []
        for sarm in sarms:

            def run_plan(plan: CutPlan, arm: Arm = sarm.arm) -> TrialResult:
                counter[0] += 1
                return run_one(spec_for(scenario, arm, plan, counter[0]))

            db = run.path / "hypothesis-db" / _slug(sarm.arm.label()) if research_db else None
            found = search_arm(scenario, sarm, run_plan, db)
            results.append(found.to_dict())
            run.write_text("search.json", json.dumps({"profile": scenario.profile, "arms": results}, indent=2))
        return {"search": {"profile": scenario.profile, "arms": results}}

    return drive
