"""CRIU's network lock (``--network-lock nftables``), left by nobody.

A dump that stops its tree locks the host's network with a table ``inet
CRIU-<the dump's run id>`` and leaves it for the restore to remove. A cut whose
image is never restored (a refused or failed restore, a hunt's replaced image)
must remove it itself: every table left is a filter chain that each packet on
the host passes, and that each later dump's lock reads.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

from cutbench.harness.model.plan import Cut
from cutbench.harness.model.timeline import Timeline
from cutbench.harness.nemesis.backends.criu import CriuCheckpointer
from cutbench.harness.nemesis.base import CutContext
from cutbench.procs import spawn


def lock_tables() -> set[str]:
    """The names of the host's ``inet CRIU-*`` tables."""
    listed = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True, timeout=60)
    assert listed.returncode == 0, listed.stderr
    return {line.split()[-1] for line in listed.stdout.splitlines() if line.startswith("table inet CRIU-")}


def lock_of(images: Path) -> str:
    """The table CRIU names after the dump in ``images`` (its run id in inventory.img, cut to 21 characters)."""
    run_id = re.search(rb"[0-9a-f]{8}(?:-[0-9a-f]{4}){3}-[0-9a-f]{12}", (images / "inventory.img").read_bytes())
    assert run_id, "no run id in inventory.img"
    return "CRIU-" + run_id.group().decode()[:21]


def test_a_stopped_dump_never_restored_takes_its_network_lock_with_it_and_a_restored_one_has_none_left(criu, tmp_path):
    assert shutil.which("nft"), "nft (Debian's nftables, installed with the container engines) is needed to see the lock"
    backend = CriuCheckpointer()
    for restored in (False, True):
        child = spawn([sys.executable, "-c", "import time; time.sleep(60)"], cwd=str(tmp_path))
        ctx = CutContext(images_dir=tmp_path / f"images-{restored}", timeline=Timeline("t0"), cut_index=0,
                         cut=Cut(op=1, phase="admit", fault="kill"))
        try:
            backend.checkpoint(child, ctx)
            table = lock_of(ctx.images_dir)
            assert table in lock_tables()  # the dumped tree is gone; the lock waits for a restore
            child.kill()  # reaped: a zombie's pid would fail the restore
            if restored:
                child.replaced_by(backend.restore(ctx))
                ctx.restored = True  # as the pipeline says of a restore that returned
                assert table not in lock_tables()  # the restore removed it
            backend.cleanup(ctx)
            assert table not in lock_tables()
        finally:
            child.kill()
