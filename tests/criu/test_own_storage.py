"""The harness's own storage running out is the harness's, never a finding or a refusal blamed on the tool.

Real small tmpfs mounts (the suite runs as root, as CRIU needs), real CRIU dumps into them.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.fixtures.run_fixtures import cli, counter_scenario

pytestmark = pytest.mark.criu


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Callable[[str, str], Path]]:
    """``mount(name, size)`` mounts a tmpfs of ``size`` (``"3m"``) under ``tmp_path``; all are unmounted after."""
    mounted: list[Path] = []

    def mount(name: str, size: str) -> Path:
        where = tmp_path / name
        where.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], check=True)
        mounted.append(where)
        return where

    yield mount
    for where in reversed(mounted):
        subprocess.run(["umount", "-l", str(where)], check=False)


def _scenario(tmp_path: Path, *, state_size: int = 4096, phases: str = '["publish", "ack"]') -> Path:
    text = counter_scenario("disk", modes=["idempotent"], faults=["kill"], phases=["publish"])
    text = text.replace("state_size = 4096", f"state_size = {state_size}").replace('phases = ["publish"]', f"phases = {phases}")
    path = tmp_path / "disk.toml"
    path.write_text(text)
    return path


def test_an_images_directory_without_room_is_refused_before_the_run(small_tmpfs, tmp_path: Path):
    images = small_tmpfs("img", "3m")
    out = tmp_path / "out"
    done = cli("run", str(_scenario(tmp_path)), "--out", str(out), "--set", f'pipeline.images_dir="{images}"')
    assert done.returncode == 254, done.stderr[-2000:]
    assert f"pipeline.images_dir {images} has 3.0 MiB free" in done.stderr and "Traceback" not in done.stderr
    assert not out.exists()


def test_an_images_directory_that_fills_in_a_dump_is_unknown_and_the_run_fails(small_tmpfs, tmp_path: Path):
    # Room for the check before the run (32 MiB), not for the image of a 32 MiB state (about 50 MB).
    images = small_tmpfs("img", "40m")
    out = tmp_path / "out"
    done = cli("run", str(_scenario(tmp_path, state_size=4 << 20, phases='["publish"]')), "--out", str(out), "--json",
               "--set", f'pipeline.images_dir="{images}"')
    assert done.returncode == 2, done.stderr[-2000:]  # unknown only: never "refused cleanly", never exit 0
    result = json.loads(done.stdout)
    assert result["outcomes"] == {"unknown": 1}
    trial = json.loads(next(Path(result["run_dir"]).glob("trials/t0001.json")).read_text())
    error = trial["record"]["error"]
    assert "the images directory (pipeline.images_dir)" in error and "is full" in error and "no claim about the tool" in error
    assert list(images.iterdir()) == []  # the cut's files went with the trial


def test_a_results_directory_that_fills_during_the_run_says_how_to_finish(small_tmpfs, tmp_path: Path):
    out = small_tmpfs("out", "6m")
    proc = subprocess.Popen([sys.executable, "-m", "cutbench", "run", str(_scenario(tmp_path, phases='["admit", "launch", "publish", "ack", "commit"]')),
                             "--out", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def fill_once_a_trial_is_stored() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not list(out.glob("*/trials/t0001.json")):
            time.sleep(0.02)
        with open(out / "filler", "wb") as fh:  # every block left, as another job on the disk would take them
            try:
                while True:
                    fh.write(b"\0" * (1 << 16))
                    fh.flush()
            except OSError:
                pass

    filler = threading.Thread(target=fill_once_a_trial_is_stored)
    filler.start()
    stdout, stderr = proc.communicate(timeout=300)
    filler.join()
    assert proc.returncode == 254, stderr[-3000:]
    assert "Traceback" not in stderr and "internal error" not in stderr
    line = next(line for line in stderr.splitlines() if "is full" in line)
    run_dir = next(p for p in out.iterdir() if p.is_dir() and not p.is_symlink())
    assert f"the results directory {run_dir} is full" in line
    assert "trial files" in line and (f"cutbench run --resume {run_dir}" in line or f"cutbench report {run_dir}" in line)

    # Once there is room, the command it names finishes the run with every trial.
    (out / "filler").unlink()
    finish = line.split("`")[1].split()
    done = cli(*finish[1:])
    assert done.returncode == 0, done.stderr[-2000:]
    assert len(list((run_dir / "trials").glob("t*.json"))) == 5 and (run_dir / "report.html").is_file()

