"""A small program that knows nothing of cutbench: a hash chain that prints one line per step.

    python ticker.py [--steps N] [--interval-ms MS] [--save-every K] [--resume] [--carbon HOST:PORT]
                     [--saves FILE] [--save-on-term]

Each step advances a state (a SHA-256 chain) and prints ``step <n> <state>``
on stdout. Every ``--save-every`` steps it saves its state to
``ticker.state`` (written to a temporary file, then renamed); ``--resume``
starts from that file instead of from step 0, as a real program's own
restart flag does. At the end it writes ``result.txt``. Deterministic: the
same steps always print the same lines.

With ``--carbon HOST:PORT`` it sends each step to a metrics collector
instead, over one TCP connection in Graphite's plaintext protocol
(``ticker.state <value> <step>``, the step in the timestamp's place), as a
program pushing its metrics to Graphite or InfluxDB does.

With ``--saves FILE`` it also appends ``saved <n> <state>`` to FILE after
each save (opened, appended to and closed each time, as a program's own
log of its checkpoints).

With ``--save-on-term`` a SIGTERM makes it save at the end of the step it is
in and exit with status 143, as a program that checkpoints when its
scheduler preempts it does (Slurm signals a job step when its grace time
begins).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import signal
import socket
import sys
import time

STATE = "ticker.state"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--interval-ms", type=float, default=20.0)
    parser.add_argument("--save-every", type=int, default=10)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--carbon", default="", help="HOST:PORT of a Graphite plaintext collector")
    parser.add_argument("--saves", default="", help="a file to append a line to after each save")
    parser.add_argument("--save-on-term", action="store_true", help="save and exit 143 on SIGTERM")
    args = parser.parse_args()
    terminated = []
    if args.save_on_term:
        signal.signal(signal.SIGTERM, lambda *_: terminated.append(True))
    carbon = None
    if args.carbon:
        host, port = args.carbon.rsplit(":", 1)
        carbon = socket.create_connection((host, int(port))).makefile("w")
    step, state = 0, hashlib.sha256(b"ticker").hexdigest()
    if args.resume and os.path.exists(STATE):
        with open(STATE) as fh:
            saved_step, saved_state = fh.read().split()
        step, state = int(saved_step), saved_state
        print(f"resumed from step {step}", file=sys.stderr, flush=True)
    while step < args.steps:
        step += 1
        state = hashlib.sha256(f"{state}:{step}".encode()).hexdigest()
        if carbon is None:
            print(f"step {step} {state}", flush=True)
        else:
            carbon.write(f"ticker.state {int(state[:12], 16)} {step}\n")
            carbon.flush()  # a line at a time, as a metrics client sends them
        if step % args.save_every == 0 or terminated:
            with open(STATE + ".tmp", "w") as fh:
                fh.write(f"{step} {state}")
            os.replace(STATE + ".tmp", STATE)
            if args.saves:
                with open(args.saves, "a") as fh:
                    fh.write(f"saved {step} {state}\n")
        if terminated:
            print(f"saved at step {step} on SIGTERM", file=sys.stderr, flush=True)
            return 143
        time.sleep(args.interval_ms / 1000.0)
    with open("result.txt", "w") as fh:
        fh.write(state + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
