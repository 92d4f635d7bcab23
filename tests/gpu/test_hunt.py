"""``cutbench hunt`` on a real GPU: the driver API's lifecycle searched, every deviation shown by its reproducer alone."""

from __future__ import annotations

import pytest

from cutbench.harness.nemesis.hunt import unavailable_reason
from cutbench.harness.runner.hunt import hunt

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("tool", ["cuda", "cuda-checkpoint"])
def test_the_hunt_blames_no_deviation_on_the_harness(tool, tmp_path):
    reason = unavailable_reason(tool)
    if reason:
        pytest.skip(reason)
    doc = hunt(tool, tmp_path, budget_s=40, length=8, repeat=1, bound_s=30, say=lambda _m: None)
    assert doc["search"]["sequences"] >= 3 and not doc["search"]["harness_errors"]
    # Every deviation found must show in its standalone reproducer: one that does not is the harness's bug.
    assert doc["harness_deviations"] == [], [f["standalone"] for f in doc["findings"]]
    tried = doc["search"]["transitions"]
    assert any(k.startswith("checkpoint@locked->ok") for k in tried), tried
    # The documented round trip held whenever it was walked: an unlock after a restore answered ok.
    assert "unlock@locked->refused" not in tried, tried
