"""A damaged run directory gives every reading command a clear error naming the file, exit 254.

Never a traceback and never a silent success (a report of "0 of N trials",
"0 verdicts differ" over nothing).
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from tests.fixtures.run_fixtures import cli


def _drop_trials_table(run: Path) -> str:
    (run / "trials.parquet").unlink()
    return "trials.parquet: missing"


def _truncate_timeline(run: Path) -> str:
    path = run / "timeline.parquet"
    path.write_bytes(path.read_bytes()[:100])
    return "timeline.parquet: not a readable Parquet table"


def _drop_a_column(run: Path) -> str:
    path = run / "trials.parquet"
    pd.read_parquet(path).drop(columns=["outcome"]).to_parquet(path)
    return "trials.parquet: lacks column(s) outcome"


def _corrupt_a_trial_record(run: Path) -> str:
    first = sorted((run / "trials").glob("*.json"))[0]
    first.write_text(first.read_text()[:40])
    return f"{first.name}' is not valid JSON"


def _remove_the_trial_records(run: Path) -> str:
    for p in (run / "trials").glob("*.json"):
        p.unlink()
    return "holds 0 trial files, run.toml counts"


def _a_file_from_another_run(run: Path) -> str:
    first = sorted((run / "trials").glob("*.json"))[0]
    data = json.loads(first.read_text())
    data["run_id"] = "20260101T000000Z-other-0000"
    first.write_text(json.dumps(data))
    return "belongs to run '20260101T000000Z-other-0000'"


def _damage_run_toml(run: Path) -> str:
    (run / "run.toml").write_text("status = \n")
    return "run.toml' is not valid TOML"


@pytest.mark.parametrize("damage", [_drop_trials_table, _truncate_timeline, _drop_a_column, _corrupt_a_trial_record,
                                    _remove_the_trial_records, _a_file_from_another_run, _damage_run_toml],
                         ids=lambda f: f.__name__.strip("_"))
def test_reading_commands_name_the_damaged_file(mixed_run_copy: Path, damage):
    says = damage(mixed_run_copy)
    # analyze reads the trial records and tables; report redraws from the tables and run.toml.
    commands = [("analyze", str(mixed_run_copy)), ("report", str(mixed_run_copy))]
    if damage in (_drop_trials_table, _drop_a_column, _damage_run_toml):
        commands.append(("compare", str(mixed_run_copy), str(mixed_run_copy)))
    for args in commands:
        proc = cli(*args)
        if damage in (_corrupt_a_trial_record, _remove_the_trial_records, _a_file_from_another_run) and args[0] == "report":
            # report draws from the tables only: those are intact here, so it succeeds.
            assert proc.returncode == 0, (args, proc.returncode, proc.stderr[-1500:])
            continue
        assert proc.returncode == 254, (args, proc.returncode, proc.stdout[-800:], proc.stderr[-1500:])
        assert says in proc.stderr and "Traceback" not in proc.stderr, (args, proc.stderr[-1500:])


@pytest.mark.parametrize("damage", [_drop_trials_table, _truncate_timeline, _drop_a_column, _corrupt_a_trial_record,
                                    _remove_the_trial_records, _a_file_from_another_run, _damage_run_toml],
                         ids=lambda f: f.__name__.strip("_"))
def test_open_run_names_the_damaged_file(mixed_run_copy: Path, damage):
    """The Python API checks the directory as ``analyze`` does: every damage is an error naming its file."""
    import cutbench
    from cutbench.errors import InvalidArgument

    says = damage(mixed_run_copy)
    with pytest.raises(InvalidArgument) as caught:
        cutbench.open_run(mixed_run_copy)
    assert says in str(caught.value)
