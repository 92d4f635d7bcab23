"""The support matrix on a GPU: a probe the tools continue identically, and one the driver cannot
checkpoint, through the driver API in place (a minute on an H200)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from tests.fixtures.run_fixtures import cli


def test_device_memory_continues_identically_and_managed_memory_does_not(results_root: Path):
    proc = cli("matrix", "--probe", "device_memory_1MiB", "--probe", "managed_memory_prefetch", "--tool", "cuda",
               "--fault", "none", "--out", str(results_root), "--json", timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    table = pd.read_parquet(Path(json.loads(proc.stdout)["run_dir"]) / "matrix.parquet")
    cells = dict(zip(table["row"], table["cell"], strict=True))
    assert cells["device_memory_1MiB"] == "identical"
    # Driver 580: CUDA_ERROR_NOT_SUPPORTED at the checkpoint, the process left LOCKED (results/reference/matrix).
    assert cells["managed_memory_prefetch"] in ("failed", "refused"), table.to_dict("records")
