"""Receiver benchmark: durable acked effects/s and ack latency, by store and client count.

    python -m cutbench.receivers.bench [--clients 1,8,32] [--stores sqlite,postgresql] [--seconds 3] [--windows 1,32]

Each client is its own process with one ``ReceiverClient``; with window 1 it
publishes and waits for each ack in turn (what a workload does), a larger
window keeps that many effects in flight (send_effect several, then wait_ack). Every counted effect was acked, so
it is committed durably. Prints one table; not a test, figures vary by machine.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import tempfile
import time
from pathlib import Path

from .client import ReceiverClient
from .process import start_receiver


def _client(args: tuple[str, str, int, float, float]) -> tuple[int, list[float]]:
    address, trial, window, t_start, t_end = args
    c = ReceiverClient(address, wait_timeout=60)
    c.health()  # connect before the clock starts
    lat: list[float] = []
    op = 0
    time.sleep(max(0.0, t_start - time.time()))
    while time.time() < t_end:
        sent = {}
        for _ in range(window):
            sent[op] = time.perf_counter()
            c.send_effect(trial, op, 0, "bench")
            op += 1
        for o, t0 in sent.items():
            c.wait_ack(o, trial=trial)
            lat.append(time.perf_counter() - t0)
    c.close()
    return len(lat), lat


def run_one(address: str, clients: int, seconds: float, window: int, tag: str) -> dict:
    """Run ``clients`` processes against ``address`` for ``seconds``; return throughput and latency."""
    with ReceiverClient(address) as ctl:
        trials = [f"bench-{tag}-{clients}-{i}" for i in range(clients)]
        for t in trials:
            ctl.open_trial(t, "at_least_once")
    t_start = time.time() + 0.5
    t_end = t_start + seconds
    with mp.get_context("fork").Pool(clients) as pool:
        results = pool.map(_client, [(address, t, window, t_start, t_end) for t in trials])
    elapsed = max(seconds, time.time() - t_start)
    lat = sorted(x for _, ls in results for x in ls)
    n = len(lat)
    return {
        "clients": clients,
        "acked": n,
        "per_s": n / elapsed,
        "p50_ms": 1000 * statistics.median(lat) if lat else float("nan"),
        "p99_ms": 1000 * lat[min(n - 1, int(n * 0.99))] if lat else float("nan"),
    }


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print the table; returns the exit code."""
    ap = argparse.ArgumentParser(prog="python -m cutbench.receivers.bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", default="1,8,32", help="comma-separated client counts")
    ap.add_argument("--stores", default="sqlite,postgresql", help="comma-separated: sqlite, postgresql")
    ap.add_argument("--seconds", type=float, default=3.0, help="measured seconds per configuration")
    ap.add_argument("--windows", default="1,32", help="effects in flight per client (1 = publish, wait)")
    args = ap.parse_args(argv)
    counts = [int(x) for x in args.clients.split(",")]
    windows = [int(x) for x in args.windows.split(",")]
    rows = []
    with tempfile.TemporaryDirectory(prefix="cutbench-bench-") as tmp:
        for store in args.stores.split(","):
            cluster = None
            if store == "sqlite":
                url = f"sqlite:{Path(tmp) / 'bench.db'}"
            elif store == "postgresql":
                from .pgcluster import start_cluster

                cluster = start_cluster()
                url = cluster.create_database()
            else:
                ap.error(f"unknown store {store!r}")
            try:
                with start_receiver(url, Path(tmp) / store) as h:
                    for w in windows:
                        for n in counts:
                            r = run_one(h.address, n, args.seconds, w, f"{store}-w{w}")
                            rows.append({"store": store, "window": w, **r})
                            print(f"  {store:10s} window {w:3d} {n:3d} clients: {r['per_s']:9.0f} acked/s",
                                  flush=True)
            finally:
                if cluster is not None:
                    cluster.stop()
    print(f"\nreceiver benchmark: {args.seconds:g}s per row, "
          f"{mp.cpu_count()} CPUs, durable acks (SQLite WAL synchronous=FULL / PostgreSQL defaults)")
    print(f"{'store':10s} {'window':>6s} {'clients':>7s} {'acked/s':>9s} {'p50 ms':>7s} {'p99 ms':>7s} {'acked':>8s}")
    for r in rows:
        print(f"{r['store']:10s} {r['window']:6d} {r['clients']:7d} {r['per_s']:9.0f} {r['p50_ms']:7.2f} "
              f"{r['p99_ms']:7.2f} {r['acked']:8d}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
