"""A job worker that knows nothing of cutbench: it takes jobs in order, announces each one done on stdout and
commits it to a SQLite database, as a queue consumer that acknowledges work and records it does.

    python worker.py [--jobs N] [--interval-ms MS] [--order announce-commit|commit-announce] [--resume]
                     [--announce FILE]

Job ``n``'s result is a SHA-256 chain over the jobs before it. For each job the worker

- ``announce-commit`` (the default): prints ``done n RESULT``, then inserts ``(n, RESULT)`` into ``jobs.db`` and
  commits;
- ``commit-announce``: commits first, then prints.

``--announce FILE`` appends the announcements to FILE (opened for each line, as a log a collector tails) instead
of printing them. ``--resume`` continues after the last job ``jobs.db`` holds, as a real worker's restart does. Neither order is safe
by itself: a crash between the two steps either announces a job that is then done again (announce, crash, redo:
a consumer that keeps each job once is not hurt) or records a job that is never announced (commit, crash, skip:
no consumer can make up for it). The database is in write-ahead-log mode, as most applications' are, and the
connection stays open (CRIU wants ``--file-locks`` for the lock it holds). At the end it writes ``result.txt``.
"""

from __future__ import annotations

import argparse
import hashlib
import sqlite3
import sys
import time

ORDERS = ("announce-commit", "commit-announce")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=40)
    parser.add_argument("--interval-ms", type=float, default=20.0)
    parser.add_argument("--order", choices=ORDERS, default=ORDERS[0])
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--announce", default="", help="a file to append the announcements to (default: stdout)")
    args = parser.parse_args()

    def announce(line: str) -> None:
        if not args.announce:
            print(line, flush=True)
            return
        with open(args.announce, "a") as log:
            log.write(line + "\n")

    db = sqlite3.connect("jobs.db", isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    db.execute("CREATE TABLE IF NOT EXISTS done (job INTEGER PRIMARY KEY, result TEXT NOT NULL)")
    job, result = 0, hashlib.sha256(b"jobs").hexdigest()
    if args.resume:
        last = db.execute("SELECT job, result FROM done ORDER BY job DESC LIMIT 1").fetchone()
        if last is not None:
            job, result = last
            print(f"resumed after job {job}", file=sys.stderr, flush=True)
    while job < args.jobs:
        job += 1
        result = hashlib.sha256(f"{result}:{job}".encode()).hexdigest()
        time.sleep(args.interval_ms / 1000.0)  # the job's work
        if args.order == "announce-commit":
            announce(f"done {job} {result}")
            db.execute("INSERT INTO done VALUES (?, ?)", (job, result))
        else:
            db.execute("INSERT INTO done VALUES (?, ?)", (job, result))
            announce(f"done {job} {result}")
    db.close()
    with open("result.txt", "w") as fh:
        fh.write(result + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
