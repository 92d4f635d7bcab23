"""A hunt's files: ``hunt.json`` (everything measured), ``FINDINGS.md`` (the table a reader wants), ``repro/``.

Layout of a hunt directory::

    hunt.json        tool, environment, the search's and the random walk's counts, every deviation
    FINDINGS.md      one row per deviation: sequence, the documented promise, what happened, reproducer
    repro/NAME.py    one standalone reproducer per deviation (no cutbench in it)

:func:`read_hunt` reads ``hunt.json`` back and names the file when it is damaged.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cutbench.errors import InvalidArgument
from cutbench.files import atomic_write


def write_reproducer(out: Path, name: str, text: str) -> Path:
    """Store one reproducer as ``out/repro/NAME.py``; returns its path."""
    path = out / "repro" / f"{name}.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, text)
    path.chmod(0o755)
    return path


def write_hunt(out: Path, doc: dict[str, Any]) -> Path:
    """Store ``hunt.json`` and ``FINDINGS.md`` in ``out``; returns the path of ``FINDINGS.md``."""
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(out / "hunt.json", json.dumps(doc, indent=2, default=str) + "\n")
    path = out / "FINDINGS.md"
    atomic_write(path, render(doc))
    return path


def read_hunt(out: Path) -> dict[str, Any]:
    """``hunt.json`` of a hunt directory; :class:`InvalidArgument` naming the file when it is missing or damaged."""
    path = out / "hunt.json"
    try:
        return dict(json.loads(path.read_text()))
    except FileNotFoundError as exc:
        raise InvalidArgument(f"{path}: not a hunt directory (no hunt.json)") from exc
    except (OSError, ValueError) as exc:
        raise InvalidArgument(f"{path}: damaged ({exc}); run the hunt again") from exc


def render(doc: dict[str, Any]) -> str:
    """``FINDINGS.md``: the environment, the search's counts, then one section per deviation."""
    env = doc.get("environment", {})
    s, w = doc["search"], doc.get("walk")
    lines = [f"# Lifecycle hunt: {doc['tool']}", "",
             f"- driver {env.get('driver_version', '?')}, GPU {env.get('gpu_name', '?')}, "
             f"CRIU {env.get('criu_version', '?')}, kernel {env.get('kernel', '?')}",
             f"- command: `{doc.get('command', '')}`",
             f"- directed search (Hypothesis state machine): {s['sequences']} sequences, {s['steps']} steps, "
             f"{s['seconds']:.0f} s; deviations: {len(doc['findings'])}"]
    if w:
        lines.append(f"- random walk of the same steps: {w['sequences']} sequences, {w['steps']} steps, "
                     f"{w['seconds']:.0f} s; deviations: {len(w['signatures'])}")
    if s.get("harness_errors"):
        lines.append(f"- the harness's own trouble (never a finding): {'; '.join(s['harness_errors'][:3])}")
    lines.append("")
    if not doc["findings"]:
        lines += ["No deviation from the documented lifecycle was found.", ""]
    for f in doc["findings"]:
        d = f["deviation"]
        runs = f.get("standalone", [])
        shown = sum(r["shown"] for r in runs)
        lines += [f"## {f['id']}: {d['invariant']}", "",
                  f"- **sequence** ({len(f['sequence'])} steps): " + " → ".join(f["sequence_text"]),
                  f"- **documented**: {d['promised']} ({d['source']})",
                  f"- **happened**: {d['summary']}",
                  f"- **the tool's words**: {str(d['observed'].get('detail') or '')[:300]}",
                  f"- **first met**: after {f['first_at']['search']} sequences of the directed search"
                  + (f", {f['first_at']['walk']} of the random walk" if f["first_at"].get("walk") is not None
                     else ", never by the random walk" if w else ""),
                  f"- **reproducer**: `{f['reproducer']}`, shown on its own {shown} of {len(runs)} runs",
                  f"- **public report**: {f['public_report']}", ""]
    return "\n".join(lines)
