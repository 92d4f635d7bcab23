"""``cutbench hunt``: a tool's lifecycle searched for deviations, on the command line (:mod:`~cutbench.harness.integrations.cli`
adds it to the ``cutbench`` group)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from cutbench.errors import EXIT_CHECK_FAILED, EXIT_OK, InvalidArgument
from cutbench.harness.integrations.console import say


@click.command()
@click.option("--tool", required=True, metavar="TOOL",
              help="cuda (the driver API), cuda-checkpoint (NVIDIA's utility), criu-cuda-plugin, criu (a CPU probe), or a "
                   "container engine: docker or podman (a CPU probe in a container).")
@click.option("--budget", "budget_s", type=float, default=300.0, show_default=True, metavar="S",
              help="Seconds of directed search (a shrink in progress may run up to half as long again).")
@click.option("--random-walk", "walk_s", type=float, default=0.0, metavar="S",
              help="Also run S seconds of random walk over the same steps, to measure the search against it.")
@click.option("--length", type=int, default=10, show_default=True, help="Steps per sequence.")
@click.option("--repeat", type=int, default=3, show_default=True,
              help="Runs of each reproducer on its own (0: write them, run none).")
@click.option("--bound", "bound_s", type=float, default=60.0, show_default=True, metavar="S",
              help="The longest any one step may take; past it the step is a hang (a finding).")
@click.option("--sequences", type=int, default=None, metavar="N",
              help="Also stop once N sequences ran, shrinking's included (an effort budget, the same on any host).")
@click.option("--seed", type=int, default=None, help="Draw the same sequences on every run (a repeatable search).")
@click.option("--model", "overrides", multiple=True, metavar="ACTION@STATE=ok|refused",
              help="State a promise in place of the documented one (repeatable), e.g. criu_restore@running=ok.")
@click.option("--out", default="results/hunt", show_default=True, type=click.Path(file_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print hunt.json's summary as JSON.")
def hunt(tool: str, budget_s: float, walk_s: float, length: int, repeat: int, bound_s: float, sequences: int | None,
         seed: int | None, overrides: tuple[str, ...], out: str, as_json: bool) -> None:
    """Search a tool's lifecycle for deviations from its documentation; shrink each to a standalone reproducer.

    Writes OUT/TOOL/hunt.json, FINDINGS.md and repro/*.py. Exits 1 when a deviation was found, 0 when none.
    """
    from cutbench.harness.hunt import runner

    stated = {}
    for item in overrides:
        key, _, value = item.partition("=")
        if "@" not in key or value not in ("ok", "refused"):
            raise InvalidArgument(f"--model {item!r}: write ACTION@STATE=ok or ACTION@STATE=refused, "
                                  "e.g. criu_restore@running=ok")
        stated[key] = value
    doc = runner.hunt(tool, Path(out) / tool, budget_s=budget_s, walk_s=walk_s, length=length, repeat=repeat,
                      bound_s=bound_s, overrides=stated, sequences=sequences, seed=seed,
                      command="cutbench hunt " + " ".join(sys.argv[2:]),
                      say=(lambda _m: None) if as_json else say)
    if as_json:
        click.echo(json.dumps({"out": str(Path(out) / tool), "search": doc["search"], "walk": doc["walk"],
                               "findings": [{"id": f["id"], "summary": f["deviation"]["summary"],
                                             "shown": sum(r["shown"] for r in f["standalone"]),
                                             "public_report": f["public_report"]} for f in doc["findings"]]}))
    sys.exit(EXIT_CHECK_FAILED if doc["findings"] else EXIT_OK)
