"""A failing trial in plain words, from its stored row, findings and receiver rows.

``report.html`` puts the explanation beside each trial's timeline and
``summary.md`` under each failing trial, so a reader does not rebuild the
story from "duplicate op 3 (applied 2 times (epochs [0, 1]))". Pure: data in,
text out, the same for a stored run as for a fresh one.

Incarnation ``e`` is the process of epoch ``e``: 0 the original, 1 the
first restored (or restarted) one, and so on. Who sent a delivery is the
receiver's ``sender`` column (the incarnation that put the frame on the
wire: a restored process resending an op it owed is the sender, though the
op keeps the ``epoch`` it was made in); a run stored before senders were
recorded falls back to ``epoch`` (:func:`sender_of`).
"""

from __future__ import annotations

import json
import re
from typing import Any

import pandas as pd

from cutbench.harness.model.schema import CRIU_OWN_OPTIONS


FAULT_WORDS = {
    "kill": "the original was killed after the checkpoint",
    "leave_running": "the original ran on after the checkpoint and then crashed",
    "none": "the original was resumed in place",
}
MODE_WORDS = {
    "at_least_once": "the receiver in at_least_once mode applies every delivery it gets",
    "idempotent": "the receiver in idempotent mode applies each op once",
    "fenced": "the receiver in fenced mode applies only what a committed fence covers",
}


def parse_findings(text: Any) -> list[dict[str, Any]]:
    """A trial row's ``findings`` (its JSON, or the list :func:`cutbench.open_run` parsed it into) as a list of
    findings (each a dict with ``kind``); [] for anything else."""
    try:
        found = text if isinstance(text, list) else json.loads(text or "[]")
    except (TypeError, ValueError):
        return []
    return [f for f in found if isinstance(f, dict) and "kind" in f] if isinstance(found, list) else []


def incarnation(epoch: Any) -> int | None:
    """A receiver row's ``epoch`` as the incarnation that sent it; None for none (a NaN, or a negative epoch:
    a row the receiver made itself, such as a refused commit)."""
    try:
        value = float(epoch)
    except (TypeError, ValueError):
        return None
    return int(value) if value == value and value >= 0 else None


def sender_of(row: Any) -> int | None:
    """The incarnation that sent receiver row ``row`` (a named tuple or a dict): its ``sender`` where the client
    said it, else its ``epoch``; None for a row of the receiver's own."""
    get = row.get if isinstance(row, dict) else lambda name, default=None: getattr(row, name, default)
    said = incarnation(get("sender", None))
    return said if said is not None else incarnation(get("epoch", None))


def senders(effects: pd.DataFrame) -> list[int | None]:
    """:func:`sender_of` of every row of ``effects``, in its order."""
    if effects.empty:
        return []
    columns = [c for c in ("sender", "epoch") if c in effects]
    return [sender_of(dict(zip(columns, values))) for values in zip(*(effects[c] for c in columns))] if columns \
        else [None] * len(effects)


def op_ranges(ops: list[int]) -> str:
    """``[3, 4, 5, 7]`` as ``"ops 3–5 and 7"`` (``"op 3"`` for one)."""
    ops = sorted(set(ops))
    if not ops:
        return "no op"
    runs: list[list[int]] = [[ops[0], ops[0]]]
    for op in ops[1:]:
        if op == runs[-1][1] + 1:
            runs[-1][1] = op
        else:
            runs.append([op, op])
    parts = [f"{a}" if a == b else f"{a}–{b}" for a, b in runs]
    words = parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]
    return ("op " if len(ops) == 1 else "ops ") + words


def _senders_of(effects: pd.DataFrame, ops: list[int]) -> dict[int, list[int]]:
    """Per op, the incarnations that sent the deliveries the receiver applied, in arrival order."""
    if effects.empty or not {"decision", "op_id"} <= set(effects.columns) or not {"epoch", "sender"} & set(effects):
        return {}
    applied = effects[effects["decision"].isin(["applied", "committed"]) & effects["op_id"].isin(ops)]
    applied = applied.sort_values("arrival_seq") if "arrival_seq" in applied else applied
    return {int(op): [e for e in senders(g) if e is not None] for op, g in applied.groupby("op_id")}


def _shown(effects: pd.DataFrame, ops: list[int]) -> str:
    """A program's effects ``ops`` by stream and index, ``"file:md.log effects 5600 … 5900 (4)"``; "" for a
    workload's (its effects name no stream)."""
    if not ops or effects.empty or not {"stream", "index", "op_id"} <= set(effects.columns):
        return ""
    rows = effects[effects["op_id"].isin(ops) & effects["stream"].notna()].drop_duplicates("op_id").sort_values("op_id")
    parts = []
    for stream, group in rows.groupby("stream", sort=False):
        index = [str(i) for i in group["index"]]
        span = index[0] if len(index) == 1 else f"{index[0]} … {index[-1]}"
        parts.append(f"{stream} effect{'s' * (len(index) > 1)} {span} ({len(index)})")
    return " and ".join(parts)


def _incarnations(epochs: list[int]) -> str:
    """``[0, 1]`` as ``"the original (incarnation 0) and the restored process (incarnation 1)"``."""
    said = [("the original" if e == 0 else "the restored process" if e == 1 else "a later restored process")
            + f" (incarnation {e})" for e in dict.fromkeys(epochs)]
    return " and ".join(said)


def _cut_point(trial: dict[str, Any]) -> str:
    """``op 3/admit`` for the trial's (first) cut, ``its cut point`` when the row names none."""
    try:
        op = int(float(trial.get("cut_op")))  # type: ignore[arg-type]  # None: a TypeError, caught below
    except (TypeError, ValueError, OverflowError):
        return "its cut point"
    phase = trial.get("cut_phase")
    return f"op {op}/{phase}" if isinstance(phase, str) and phase else f"op {op}"


# How CRIU names an option of its own that would have let it go on ("You can try --file-locks", "Use link-remap
# option", "Try --ext-unix-sk"): the option's name is the group.
SUGGESTS = re.compile(r"(?:[Tt]ry|[Uu]se)\s+(?:the\s+)?(?:--)?([a-z][a-z0-9-]*[a-z0-9])(?:\s+option)?")


def suggested_option(error: str, given: str = "") -> str:
    """The CRIU option that a stage's ``error`` suggests, said as the fix ("CRIU suggests its option --file-locks:
    …"), or "" when it suggests none or the arm passed it already (``given``: the trial's ``criu_options``)."""
    found = SUGGESTS.search(error)
    if not found or "--" not in found.group(0) and not found.group(0).endswith("option"):  # "try again" is none
        return ""
    option = "--" + found.group(1)
    if option in given.split() or option in CRIU_OWN_OPTIONS:  # passed already, or one every cut sets as it needs
        return ""
    return (f"CRIU suggests its option {option}: pipeline.criu_options = [[], [\"{option}\"]] runs the arm with and "
            "without it, side by side")


def explain(trial: dict[str, Any], effects: pd.DataFrame | None = None) -> str:
    """Plain words for one trial row of ``trials.parquet`` and the receiver's rows (the trial's, or the run's whole
    ``effects`` table): what the cut did and why the verdict is what it is. Empty for a valid trial without findings."""
    effects = effects if effects is not None else pd.DataFrame()
    if "trial_id" in effects and trial.get("trial_id") is not None:  # a run's whole table: this trial's rows
        effects = effects[effects["trial_id"] == trial["trial_id"]]
    findings = parse_findings(trial.get("findings"))
    outcome = str(trial.get("outcome") or "")
    if outcome == "valid" and not findings:
        return ""
    fault, mode = str(trial.get("fault") or ""), str(trial.get("receiver_mode") or "")
    where = _cut_point(trial)
    tool, error = trial.get("backend", "tool"), str(trial.get("error") or "no reason given").rstrip(". ")
    fix = suggested_option(error, str(trial.get("criu_options") or ""))
    fix = f" {fix}." if fix else ""
    if outcome == "refused":
        return f"The {tool} checkpoint asked for at {where} was refused, and the workload ran on uncut: {error}.{fix}"
    if outcome == "unknown":
        return f"The harness could not judge the trial (cut at {where}), so it says nothing of {tool}: {error}."
    opening = f"The {tool} checkpoint was taken at {where}"
    if fault in FAULT_WORDS:
        opening += f"; {FAULT_WORDS[fault]}"
    sentences = [opening + "."]
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for f in findings:
        by_kind.setdefault(f["kind"], []).append(f)
    dup = [int(f["op"]) for f in by_kind.pop("duplicate", []) if isinstance(f.get("op"), int)]
    shown = _shown(effects, dup)
    if shown:  # a program's: what its outside world saw
        epochs = _senders_of(effects, dup)
        who = _incarnations([e for op in dup for e in epochs.get(op, [])]) or "two incarnations"
        sentences.append(f"The outside world saw {shown} twice or more, shown by {who}: "
                         + ("the program started again from its beginning" if tool == "restart" else
                            "the program started again from its own last checkpoint" if tool == "app" else
                            "the restored program resumed from the image")
                         + " and showed again what had been shown since.")
        dup = []
    if dup:
        epochs = _senders_of(effects, dup)
        who = _incarnations([e for op in dup for e in epochs.get(op, [])]) or "two incarnations"
        sentences.append(f"The receiver applied {op_ranges(dup)} twice or more, from {who}: "
                         + ("the restored process resumed from the image and sent again what the original had already "
                            "delivered" if fault != "none" else "the resumed process sent again what it had delivered")
                         + (f", and {MODE_WORDS[mode]}." if mode in MODE_WORDS else "."))
    missing = [int(f["op"]) for f in by_kind.pop("missing", []) if isinstance(f.get("op"), int)]
    if missing:
        sentences.append(f"The workload committed {op_ranges(missing)}, but the receiver never applied "
                         f"{'it' if len(missing) == 1 else 'them'}: no incarnation delivered "
                         f"{'it' if len(missing) == 1 else 'them'} after the restore.")
    for f in by_kind.pop("mixed_epoch", []):
        sentences.append(f"State of two moments at op {f.get('op')}: {str(f.get('detail', '')).rstrip('. ')}.")
    for f in by_kind.pop("restarted", []):
        sentences.append(f"The restore did not continue the run: {str(f.get('detail', '')).rstrip('. ')}.")
    for f in by_kind.pop("process_lost", []):
        sentences.append(f"The workload did not survive the tool: {str(f.get('detail', '')).rstrip('. ')}.{fix}")
    for kind, found in by_kind.items():
        for f in found:
            sentences.append(f"{str(kind).replace('_', ' ').capitalize()}"
                             + (f" at op {f['op']}" if f.get("op") is not None else "") + f": {str(f.get('detail', '')).rstrip('. ')}.")
    return " ".join(sentences)
