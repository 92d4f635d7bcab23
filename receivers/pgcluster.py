"""A throwaway PostgreSQL cluster (initdb + pg_ctl in a temporary directory).

Used by the PostgreSQL store tests and the benchmark: a real server, no mocks.
The cluster listens only on a Unix socket inside its own directory, so it
needs no free TCP port and is reachable by nobody else. PostgreSQL refuses to
run as root; as root the cluster runs as the ``postgres`` system user (which
Debian's package creates).
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path

from cutbench.errors import Unavailable


def find_pg_bin() -> Path | None:
    """Return the directory holding ``initdb`` and ``pg_ctl`` (newest Debian version first), or None."""
    for cand in sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(p.split("/")[-2]), reverse=True):
        if os.access(os.path.join(cand, "initdb"), os.X_OK) and os.access(os.path.join(cand, "pg_ctl"), os.X_OK):
            return Path(cand)
    initdb = shutil.which("initdb")
    if initdb and shutil.which("pg_ctl"):
        return Path(initdb).parent
    return None


class PgCluster:
    """A running throwaway cluster; ``url`` connects as superuser ``postgres``; ``stop`` removes it."""

    def __init__(self, bindir: Path):
        self.bindir = bindir
        self.run_as = "postgres" if os.geteuid() == 0 else None
        self.root = Path(tempfile.mkdtemp(prefix="cutbench-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        if self.run_as:
            pw = pwd.getpwnam(self.run_as)
            os.chown(self.root, pw.pw_uid, pw.pw_gid)
        self.url = f"postgresql:///postgres?host={self.root}&user=postgres"
        try:
            self._pg("initdb", "-D", str(self.data), "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync")
            self._pg("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60", "-o",
                     f"-c listen_addresses='' -k {self.root} -c max_connections=200", "start")
        except BaseException:
            self.stop()
            raise

    def _pg(self, tool: str, *args: str) -> None:
        res = subprocess.run([str(self.bindir / tool), *args], user=self.run_as, cwd=self.root,
                             stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
        if res.returncode != 0:
            log = self.log.read_text(errors="replace")[-2000:] if self.log.exists() else ""
            raise Unavailable(f"{tool} failed ({res.returncode}): {res.stderr.strip()[-2000:]}\n{log}")

    def create_database(self, name: str | None = None) -> str:
        """Create a fresh database; return a URL for it."""
        import psycopg

        name = name or "db_" + uuid.uuid4().hex[:12]
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return f"postgresql:///{name}?host={self.root}&user=postgres"

    def stop(self) -> None:
        """Stop the server immediately and delete its directory; safe to call twice."""
        if (self.data / "postmaster.pid").exists():
            try:
                self._pg("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
            except Unavailable:
                pass  # already gone; removing the directory is all that is left
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> "PgCluster":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_cluster() -> PgCluster:
    """Start a throwaway cluster; raises ``Unavailable`` if the server binaries are missing."""
    bindir = find_pg_bin()
    if bindir is None:
        raise Unavailable("PostgreSQL server binaries (initdb, pg_ctl) not found: run sh .ci/provision-postgres.sh "
                          "or install Debian's 'postgresql' package")
    return PgCluster(bindir)
