"""A hunt's files: ``hunt.json`` (everything measured), ``FINDINGS.md`` (the table a reader wants), ``repro/``.

Layout of a hunt directory::

    hunt.json        tool, environment, the search's and the random walk's counts, every deviation
    FINDINGS.md      one row per deviation: sequence, the documented promise, what happened, reproducer
    repro/NAME.py    one standalone reproducer per deviation (no cutbench in it)

:func:`read_hunt` reads ``hunt.json`` back and names the file when it is damaged; :func:`deviation_rows`
gathers the deviations of every hunt under a folder, one row each, for the support matrix's section.
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
    """Return ``hunt.json`` of a hunt directory; :class:`InvalidArgument` naming the file when it is missing or damaged."""
    path = out / "hunt.json"
    try:
        return dict(json.loads(path.read_text()))
    except FileNotFoundError as exc:
        raise InvalidArgument(f"{path}: not a hunt directory (no hunt.json)") from exc
    except (OSError, ValueError) as exc:
        raise InvalidArgument(f"{path}: damaged ({exc}); run the hunt again") from exc


def hunt_dirs(root: Path) -> list[Path]:
    """The hunt directories at ``root``: itself when it holds ``hunt.json``, else its sub-folders that do, sorted;
    :class:`InvalidArgument` naming ``root`` when there is none."""
    found = [root] if (root / "hunt.json").is_file() else sorted(p.parent for p in root.glob("*/hunt.json"))
    if not found:
        raise InvalidArgument(f"{root}: no hunt.json in it or in its sub-folders (a `cutbench hunt --out` folder)")
    return found


def deviation_rows(roots: list[Path]) -> list[dict[str, Any]]:
    """One row per deviation a hunt found for a tool, across every hunt under ``roots`` (see :func:`hunt_dirs`):
    the tool, the driver it was measured on, the shortest sequence that shows it, the documented promise and
    what happened instead, its public report, its reproducer (relative to the hunt's folder's parent) and how
    often it showed when run on its own. The same deviation of the same tool found by two hunts is one row
    (the shorter sequence's); a deviation that did not show without the harness is the harness's and is left out."""
    best: dict[tuple[str, str], dict[str, Any]] = {}
    for root in roots:
        for folder in hunt_dirs(root):
            doc = read_hunt(folder)
            env = doc.get("environment", {})
            # A hunt's summary line may lack the driver its full record holds (the utility's hunts name none).
            driver = env.get("driver_version") if env.get("driver_version") not in (None, "", "none") else \
                ((doc.get("environment_full") or {}).get("gpu") or {}).get("driver_version", "")
            harness_own = set(doc.get("harness_deviations", []))
            for f in doc.get("findings", []):
                if f["id"] in harness_own:
                    continue
                d, runs = f["deviation"], f.get("standalone", [])
                seen = d["observed"]
                happened = seen["detail"] if seen["detail"] != seen["answer"] else f"answered {seen['answer']}"
                if seen.get("continues_detail"):
                    happened += f"; {seen['continues_detail']}"
                row = {"tool": doc["tool"], "id": f["id"], "driver": driver or "",
                       "sequence": _on_probe(f) + " → ".join(f["sequence_text"]), "steps": len(f["sequence_text"]),
                       "invariant": d["invariant"], "promised": f"{d['action']} in {d['before']}: {d['promised']}",
                       "observed": f"{happened} (left it {seen['state']})", "source": d.get("source", ""),
                       "public_report": f.get("public_report") or "not found in any public report",
                       "reproducer": f"{folder.name}/{f['reproducer']}",
                       "shown": f"{sum(bool(r.get('shown')) for r in runs)} of {len(runs)}" if runs else "not run"}
                key = (doc["tool"], d["signature"])
                if key not in best or row["steps"] < best[key]["steps"]:
                    best[key] = row
    return sorted(best.values(), key=lambda r: (r["tool"], r["steps"], r["id"]))


def _on_probe(f: dict[str, Any]) -> str:
    """"(streams probe) " before a sequence that started on a probe other than the plain one (hunts before the
    probe was a choice ran the plain one)."""
    probe = f.get("probe", "buffers")
    return "" if probe == "buffers" else f"({probe} probe) "


def render(doc: dict[str, Any]) -> str:
    """Return the text of ``FINDINGS.md``: the environment, the search's counts, then one section per deviation."""
    env = doc.get("environment", {})
    s, w = doc["search"], doc.get("walk")
    lines = [f"# Lifecycle hunt: {doc['tool']}", "",
             f"- driver {env.get('driver_version', '?')}, GPU {env.get('gpu_name', '?')}, "
             f"CRIU {env.get('criu_version', '?')}, kernel {env.get('kernel', '?')}",
             f"- command: `{doc.get('command', '')}`",
             f"- directed search (Hypothesis state machine): {s['sequences']} sequences, {s['steps']} steps, "
             f"{s['seconds']:.0f} s; deviations: {len(doc['findings'])}"
             + (f"; probes: {', '.join(f'{k} {v}' for k, v in s['probes'].items())}" if s.get("probes") else "")]
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
                  f"- **sequence** ({len(f['sequence'])} steps, the {f.get('probe', 'buffers')} probe): "
                  + " → ".join(f["sequence_text"]),
                  f"- **documented**: {d['promised']} ({d['source']})",
                  f"- **happened**: {d['summary']}",
                  f"- **the tool's words**: {str(d['observed'].get('detail') or '')[:300]}",
                  f"- **first met**: after {f['first_at']['search']} sequences of the directed search"
                  + (f", {f['first_at']['walk']} of the random walk" if f["first_at"].get("walk") is not None
                     else ", never by the random walk" if w else ""),
                  f"- **reproducer**: `{f['reproducer']}`, shown on its own {shown} of {len(runs)} runs",
                  f"- **public report**: {f['public_report']}", ""]
    return "\n".join(lines)
