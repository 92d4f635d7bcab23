"""The ``restart`` baseline and the ``restarted`` finding, beside real CRIU restores (marked ``criu``).

``restart`` is what a scheduler's requeue does: kill the job and start it from
op 1. The oracle must say so from ground truth (the workload's own count of
fresh starts) on every restart, and never on a CRIU restore, which continues.
"""

from __future__ import annotations

import json

import pandas as pd
import pytest

from tests.conftest import FULL_SUITE
from tests.fixtures.run_fixtures import run_table as run

pytestmark = pytest.mark.criu


def kinds(row: pd.Series) -> set[str]:
    return {f["kind"] for f in json.loads(row["findings"])}


def test_restart_is_reported_restarted_and_a_criu_restore_never_is(criu, results_root):
    # The quick scenario's cut points at two phases of op 3 (16 trials), at all seven (56) with CUTBENCH_FULL_SUITE=1.
    phases = [] if FULL_SUITE else ["--set", 'plan.phases=["publish", "commit"]']
    trials = run(results_root, "quick.toml", "--set", 'pipeline.backends=["restart", "criu"]', *phases, "--jobs", "3")
    assert len(trials) == (56 if FULL_SUITE else 16) and (trials["outcome"] != "unknown").all(), trials[trials["outcome"] == "unknown"]
    restart, criu_ = trials[trials["backend"] == "restart"], trials[trials["backend"] == "criu"]
    assert (restart["restores"] == 1).all()
    assert all("restarted" in kinds(r) for _, r in restart.iterrows())
    assert (criu_["restarted"] == 0).all() and (criu_["restores"] == 1).all()
    # Started again from op 1 under at_least_once: every op before the cut is applied twice.
    alo = restart[restart["receiver_mode"] == "at_least_once"]
    assert (alo["duplicate"] >= 2).all()
    # Idempotent receivers absorb the replays; the restart itself is the only finding.
    idem = restart[restart["receiver_mode"] == "idempotent"]
    assert all(kinds(r) == {"restarted"} for _, r in idem.iterrows())
    assert (restart["restart_spawn_s"] > 0).all()


def test_restart_runs_every_workload_of_the_ci_subset_to_a_verdict(criu, results_root):
    # Under one receiver mode in CI (a restart is told from a restore whatever the mode); both with CUTBENCH_FULL_SUITE=1.
    modes = [] if FULL_SUITE else ["--set", 'receiver.modes=["at_least_once"]']
    trials = run(results_root, "all-workloads.toml", "--set", "plan.source=random", "--set", "plan.trials=1",
                 "--set", 'pipeline.backends=["restart"]', *modes, "--jobs", "2")
    assert len(trials) and (trials["status"] != "unknown").all(), trials[trials["status"] == "unknown"][["variant", "arm", "error"]]
    restored = trials[trials["restores"] > 0]
    assert len(restored) and (restored["restarted"] == 1).all()
