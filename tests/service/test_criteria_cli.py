"""``cutbench criteria`` end to end on a copy of a committed reference run: the stored table, the report's section
and its plots (the whole report rendered, so not in the unit tier)."""

from __future__ import annotations

import shutil

from cutbench.harness.reports import criteria as crit
from cutbench.harness.store.rundir import RunDir
from tests.conftest import REPO

TOOLS = REPO / "results" / "reference" / "tools"


def test_the_cli_stores_the_table_and_the_report_gets_its_section(tmp_path):
    from click.testing import CliRunner

    from cutbench.harness.integrations.cli import cli

    run = tmp_path / "run"
    shutil.copytree(TOOLS / "in-place-and-baselines", run)
    result = CliRunner().invoke(cli, ["criteria", str(run), str(TOOLS / "cuda+criu")])
    assert result.exit_code == 0, result.output
    assert "| backend" in result.output and "cuda+criu" in result.output
    stored_table = RunDir.open(run).table("criteria")
    assert set(stored_table["criterion"]) == set(crit.CRITERIA)
    html = (run / "report.html").read_text()
    assert 'id="criteria"' in html and 'id="plot-criteria_speed"' in html
    assert (run / "plots" / "criteria_overhead.png").stat().st_size > 1000


