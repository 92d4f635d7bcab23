"""``cutbench hunt``: search a tool's lifecycle for deviations, shrink each, and prove it with a reproducer.

The steps, in order: check the tool can run here; run the directed search
(:func:`cutbench.harness.hunt.generator.search`) for the budget; optionally
run the random walk for the same budget, to measure the search against it;
write one standalone reproducer per deviation and run each on its own
``repeat`` times; store ``hunt.json``, ``FINDINGS.md`` and ``repro/``
(:mod:`cutbench.harness.hunt.store`). A deviation its reproducer does
not show is reported as the harness's, never as the tool's.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cutbench.errors import InvalidArgument
from cutbench.harness.environment import record
from cutbench.harness.hunt.generator import Found, HuntLog, random_walk, search, tighten
from cutbench.harness.hunt.model import check_tool, public_report
from cutbench.harness.hunt import nemesis as hands
from cutbench.harness.hunt import store


def hunt(tool: str, out: str | Path, budget_s: float = 300.0, walk_s: float = 0.0, length: int = 10,
         repeat: int = 3, bound_s: float = 60.0, overrides: dict[str, str] | None = None, command: str = "",
         sequences: int | None = None, seed: int | None = None, say: Callable[[str], None] = print) -> dict[str, Any]:
    """Hunt ``tool`` for ``budget_s`` seconds; returns the document stored as ``OUT/hunt.json``.

    ``walk_s``: seconds of random walk to measure the search against (0: none).
    ``length``: steps per sequence. ``repeat``: standalone runs of each
    reproducer. ``bound_s``: the longest any one step may take. ``overrides``:
    a stated model in place of the documented one (``{"action@state": "ok"}``).
    ``sequences``: stop the search once that many sequences ran (shrinking's
    included). ``seed``: the search draws the same sequences on every run.
    """
    check_tool(tool)
    if budget_s <= 0 or length < 1 or repeat < 0 or bound_s <= 0 or (sequences is not None and sequences < 1):
        raise InvalidArgument("hunt: --budget and --bound must be > 0 s, --length and --sequences >= 1, --repeat >= 0")
    out = Path(out)
    open_session = hands.sessions(tool, bound_s)
    say(f"hunting {tool}: {budget_s:.0f} s of sequences of up to {length} steps")
    env = record.collect()
    gpus = record.gpu_count(env)
    log = search(tool, open_session, HuntLog(tool, length, dict(overrides or {}), gpus=gpus), budget_s,
                 max_sequences=sequences, seed=seed)
    say(f"directed search: {log.sequences} sequences, {len(log.found)} deviations")
    walk = None
    if walk_s > 0:
        walk = random_walk(tool, open_session, HuntLog(tool, length, dict(overrides or {}), gpus=gpus), walk_s,
                           seed=seed or 0)
        say(f"random walk: {walk.sequences} sequences, {len(walk.found)} deviations")
    found = [tighten(tool, open_session, log, f) for f in sorted(log.found.values(), key=lambda f: f.first_at)]
    rows = []
    for n, f in enumerate(found, 1):
        ident = f"{tool}-{n}"
        rows.append(_finding(out, tool, ident, f, walk, repeat, bound_s, say))
    doc = {"tool": tool, "command": command, "environment": _environment(env), "environment_full": env,
           "budget_s": budget_s, "sequences": sequences, "seed": seed, "length": length, "bound_s": bound_s, "overrides": overrides or {},
           "search": _counts(log), "walk": _counts(walk) if walk else None, "findings": rows,
           "harness_deviations": [r["id"] for r in rows if repeat and not any(x["shown"] for x in r["standalone"])]}
    path = store.write_hunt(out, doc)
    say(f"findings: {path}")
    return doc


def _finding(out: Path, tool: str, ident: str, f: Found, walk: HuntLog | None, repeat: int, bound_s: float,
             say: Callable[[str], None]) -> dict[str, Any]:
    """One deviation's row: its reproducer written and run on its own ``repeat`` times."""
    dev = f.deviation.to_json()
    dev["step"] = len(f.sequence) - 1  # the deviating step ends its sequence (the close is the kit's last observation)
    sequence = [s for s in f.sequence if s.action != "close"]
    text = [str(s) for s in f.sequence]
    header = (f"{ident}: {f.deviation.summary}\n\nFound by `cutbench hunt --tool {tool}`; shrunk to {len(text)} "
              f"steps on the {f.probe} probe: {' -> '.join(text)}.\nDocumented: {dev['source']}\n\n"
              f"Run: python {ident}.py [--repeat N]; "
              f"exit 0 when the deviation shows, 1 when it does not, 2 when it cannot run here.\n{hands.needs(tool)}")
    path = store.write_reproducer(out, ident, hands.reproducer(tool, sequence, dev, header, f.probe))
    runs = hands.run_reproducer(path, tool, repeat, timeout_s=bound_s * (len(sequence) + 3)) if repeat else []
    say(f"{ident}: {f.deviation.summary}; shown on its own {sum(r['shown'] for r in runs)}/{len(runs)}")
    walk_at = walk.found[f.deviation.signature].first_at if walk and f.deviation.signature in walk.found else None
    return {"id": ident, "deviation": dev, "probe": f.probe, "sequence": [s.to_json() for s in f.sequence],
            "sequence_text": text,
            "observations": f.observations, "first_at": {"search": f.first_at, "search_s": f.first_s, "walk": walk_at},
            "reproducer": str(path.relative_to(out)), "standalone": runs,
            "public_report": public_report(f.deviation.step.action, f.deviation.invariant, text,
                                           str(f.deviation.observed.get("detail", "")))}


def _counts(log: HuntLog) -> dict[str, Any]:
    return {"sequences": log.sequences, "steps": log.steps, "seconds": round(time.monotonic() - log.started, 1),
            "signatures": {sig: f.first_at for sig, f in log.found.items()}, "harness_errors": log.harness_errors,
            "probes": dict(sorted(log.probes.items())),
            "transitions": dict(sorted(log.transitions.items()))}


def _environment(env: dict[str, Any]) -> dict[str, Any]:
    """The few facts a finding is read with: driver, GPU, CRIU, kernel."""
    gpu = env.get("gpu") or {}
    gpus = gpu.get("gpus") or [{}]
    first = gpus[0] if isinstance(gpus[0], dict) else {}
    return {"driver_version": gpu.get("driver_version") or "none",
            "gpu_name": first.get("name") or "none", "criu_version": (env.get("criu") or {}).get("version"),
            "kernel": env.get("kernel")}
