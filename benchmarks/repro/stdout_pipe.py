"""A program's stdout as its outside world: CRIU with the pipe's reader outside the checkpointed tree.

A program that knows nothing of cutbench shows the outside world lines on its
stdout. The reader of that pipe (a log collector, a client) is not part of
the checkpoint, so this drives exactly that with CRIU alone, no cutbench:

    a program prints one numbered line every 50 ms into a pipe read here
    → criu dump [--leave-running] → (leave_running: the original runs on, then is killed)
    → criu restore -d [--inherit-fd fd[N]:pipe:[INODE] with a fresh pipe read here]
    → what did the reader see, from whom?

Measured with CRIU 4.2.1 (``python benchmarks/repro/stdout_pipe.py``): the dump
needs no ``--external`` for the pipe; with ``--inherit-fd`` the restored
program writes into the new pipe and carries on from its image; after
``leave_running`` it prints again the lines the original printed after the
dump (what an outside reader sees twice); without ``--inherit-fd`` the restore
reports success and the program's next line finds no reader (it dies of
SIGPIPE), so nothing more arrives.

    python benchmarks/repro/stdout_pipe.py [--criu "CMD ..."] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

PROGRAM = """
import sys, time
for i in range(1, 41):
    print(f"step {i} value {i * i}", flush=True)
    time.sleep(0.05)
"""


class Reader(threading.Thread):
    """Reads lines from a pipe's read end as they come, tagging each with who it was read from."""

    def __init__(self, fd: int, tag: str, lines: list[tuple[str, str]]):
        super().__init__(daemon=True)
        self.fd, self.tag, self.lines = fd, tag, lines
        self.start()

    def run(self) -> None:
        with os.fdopen(self.fd) as fh:
            for line in fh:
                self.lines.append((self.tag, line.strip()))


def case(criu: list[str], work: Path, fault: str, inherit: bool) -> dict:
    """One dump and restore; returns the lines read, by incarnation, and CRIU's answers."""
    images = work / f"{fault}-{'inherit' if inherit else 'plain'}"
    images.mkdir()
    lines: list[tuple[str, str]] = []
    r, w = os.pipe()
    prog = subprocess.Popen([sys.executable, "-c", PROGRAM], stdout=w, stdin=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    os.close(w)
    Reader(r, "original", lines)
    while len(lines) < 10:
        time.sleep(0.01)
    inode = os.stat(f"/proc/{prog.pid}/fd/1").st_ino
    args = ["dump", "-t", str(prog.pid), "-D", str(images), "-o", "dump.log", "--shell-job"]
    dump = subprocess.run(criu + args + (["--leave-running"] if fault == "leave_running" else []),
                          capture_output=True, text=True)
    at_dump = len(lines)
    if fault == "leave_running":
        time.sleep(0.3)  # the original runs on and prints more
    if prog.poll() is None:
        prog.kill()
    prog.wait()
    time.sleep(0.1)
    original = [line for tag, line in lines if tag == "original"]
    restore_args = ["restore", "-D", str(images), "-d", "-o", "restore.log", "--shell-job",
                    "--pidfile", str(images / "pid")]
    r2, w2 = os.pipe()
    if inherit:
        restore_args += ["--inherit-fd", f"fd[{w2}]:pipe:[{inode}]"]
    Reader(r2, "restored", lines)
    restore = subprocess.run(criu + restore_args, capture_output=True, text=True, pass_fds=(w2,))
    os.close(w2)
    pid = int((images / "pid").read_text()) if (images / "pid").exists() else None
    deadline = time.monotonic() + 5
    while pid is not None and time.monotonic() < deadline and Path(f"/proc/{pid}").exists():
        try:
            os.waitpid(pid, os.WNOHANG)  # reaped here if this process is its parent (a subreaper)
        except ChildProcessError:
            pass
        time.sleep(0.05)
    if pid is not None and Path(f"/proc/{pid}").exists():
        os.kill(pid, signal.SIGKILL)
    restored = [line for tag, line in lines if tag == "restored"]
    return {"fault": fault, "inherit_fd": inherit, "dump_rc": dump.returncode, "restore_rc": restore.returncode,
            "lines_at_dump": at_dump, "original": len(original), "restored": len(restored),
            "first_restored": restored[0] if restored else None, "last_restored": restored[-1] if restored else None,
            "printed_twice": sorted(set(original) & set(restored), key=lambda s: int(s.split()[1]))}


def main(argv: list[str] | None = None) -> int:
    """Run the three cases and print what each reader saw; exit 0."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--criu", default=os.environ.get("CRIU", "criu"), help="the criu command line (default: criu)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    criu = shlex.split(args.criu)
    work = Path(tempfile.mkdtemp(prefix="stdout-pipe-"))
    try:
        out = [case(criu, work, "kill", True), case(criu, work, "leave_running", True),
               case(criu, work, "leave_running", False)]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps(out))
    else:
        for c in out:
            print(f"{c['fault']:>13} inherit-fd={c['inherit_fd']!s:5} dump {c['dump_rc']} restore {c['restore_rc']}: "
                  f"original printed {c['original']}, restored printed {c['restored']} "
                  f"({c['first_restored']} … {c['last_restored']}); printed twice: {len(c['printed_twice'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
