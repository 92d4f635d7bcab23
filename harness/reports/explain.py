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
    """Return :func:`sender_of` of every row of ``effects``, in its order."""
    if effects.empty:
        return []
    columns = [c for c in ("sender", "epoch") if c in effects]
    return [sender_of(dict(zip(columns, values))) for values in zip(*(effects[c] for c in columns))] if columns \
        else [None] * len(effects)


def op_ranges(ops: list[int]) -> str:
    """Return ``[3, 4, 5, 7]`` as ``"ops 3–5 and 7"`` (``"op 3"`` for one)."""
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


# A finding's effect as the detail names it, "… [r1#18]" (a program's: its stream and index).
KEY = re.compile(r"\[([^\]#\[]+)#([^\]#\[]+)\]\s*$")
# A server's streams are its requests ("r3", a retry "r3.1"): each one's reader is its client.
REQUEST = re.compile(r"^r\d+(\.\d+)*$")
STREAMS_LISTED = 3  # streams one sentence names; the rest are counted (the trial's JSON lists every finding)


def _keys(found: list[dict[str, Any]], effects: pd.DataFrame) -> dict[int, tuple[str, str]]:
    """A program's findings' effects as ``{op: (stream, index)}``: from the receiver's rows where the effect was
    shown, else from the finding's detail ("[r1#18]": one never shown); {} for a workload's."""
    ops = [int(f["op"]) for f in found if isinstance(f.get("op"), int)]
    out: dict[int, tuple[str, str]] = {}
    if ops and not effects.empty and {"stream", "index", "op_id"} <= set(effects.columns):
        rows = effects[effects["op_id"].isin(ops) & effects["stream"].notna()].drop_duplicates("op_id")
        out = {int(op): (str(stream), str(index)) for op, stream, index in zip(rows["op_id"], rows["stream"], rows["index"])}
    for f in found:
        said = KEY.search(str(f.get("detail", "")))
        if said and isinstance(f.get("op"), int):
            out.setdefault(int(f["op"]), (said.group(1), said.group(2)))
    return out


def positions(keys: list[tuple[str, str]]) -> str:
    """Effects ``(stream, index)`` by stream in words: ``"r1 positions 16–31 and r2 position 4"``, at most
    :data:`STREAMS_LISTED` streams named and the rest counted; "" for none."""
    by_stream: dict[str, list[str]] = {}
    for stream, index in keys:
        by_stream.setdefault(stream, []).append(index)
    parts = []
    for stream, indices in by_stream.items():
        if all(i.isdigit() for i in indices):
            words = op_ranges([int(i) for i in indices]).replace("ops ", "positions ").replace("op ", "position ")
        else:
            words = f"position {indices[0]}" if len(indices) == 1 else f"positions {indices[0]} … {indices[-1]}"
        parts.append(f"{stream} {words}")
    if len(parts) > STREAMS_LISTED:
        rest = len(parts) - STREAMS_LISTED
        parts = parts[:STREAMS_LISTED] + [f"{rest} more stream{'s' * (rest > 1)}"]
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1] if parts else ""


def _reader(keys: list[tuple[str, str]]) -> str:
    """Who a program's effects ``keys`` were meant for: a request's client, or the outside world."""
    streams = {stream for stream, _ in keys}
    if streams and all(REQUEST.match(s) for s in streams):
        return "its client" if len(streams) == 1 else "their clients"
    return "the outside world"


def _incarnations(epochs: list[int], again: str = "restored") -> str:
    """``[0, 1]`` as ``"the original (incarnation 0) and the restored process (incarnation 1)"`` (``again``:
    "started-again" for a program its own restart or a requeue started anew)."""
    said = [("the original" if e == 0 else f"the {again} process" if e == 1 else f"a later {again} process")
            + f" (incarnation {e})" for e in dict.fromkeys(epochs)]
    return " and ".join(said)


def _cut_point(trial: dict[str, Any]) -> str:
    """``op 3/admit`` for the trial's (first) cut, ``its cut point`` when the row names none."""
    try:
        op = int(float(trial.get("cut_op")))  # type: ignore[arg-type]  # None: a TypeError, caught below
    except (TypeError, ValueError, OverflowError):
        return "its cut point"
    phase = trial.get("cut_phase")
    if phase == "syscall":  # the boundary by name, where the row has it
        return f"boundary {op}" + (f" ({trial['boundary']})" if trial.get("boundary") else "")
    if phase in PROGRAM_PLACES:  # a program's cut, placed by what it showed (docs/programs.md, "Cuts and tools")
        return PROGRAM_PLACES[phase].format(op)
    return f"op {op}/{phase}" if isinstance(phase, str) and phase else f"op {op}"


# Where a program's cut of a phase landed, in words (its op counts effects, cut_time_ms steps or cut_bytes steps).
PROGRAM_PLACES = {"effect": "effect {}", "time": "time step {}", "size": "size step {}"}


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


def explain(trial: dict[str, Any], effects: pd.DataFrame | None = None, *, resume: str = "") -> str:
    """Plain words for one trial row of ``trials.parquet`` and the receiver's rows (the trial's, or the run's whole
    ``effects`` table): what the cut did and why the verdict is what it is, alike findings in one sentence (the
    trial's JSON lists each). ``resume``: a program's own restart flag (``workload.params.resume``), named where
    the ``app`` backend started it again. Empty for a valid trial without findings."""
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
    keys = _keys(findings, effects)  # a program's effects by stream and position; {} for a workload's
    sentences = [_opening(tool, fault, where, bool(keys), resume) + "."]
    if trial.get("boundary_landed"):  # its run's calls were not the recording's there
        sentences.append(f"It was {str(trial['boundary_landed']).rstrip('. ')}.")
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for f in findings:
        by_kind.setdefault(f["kind"], []).append(f)
    dup = [int(f["op"]) for f in by_kind.pop("duplicate", []) if isinstance(f.get("op"), int)]
    started = bool(keys) and tool in ("app", "restart")  # a program started anew: the opening said how
    if dup and all(op in keys for op in dup):  # a program's: what its outside world saw
        epochs = _senders_of(effects, dup)
        who = _incarnations([e for op in dup for e in epochs.get(op, [])], "started-again" if started else "restored")
        sentences.append(f"The outside world saw {positions([keys[op] for op in dup])} twice or more, shown by "
                         f"{who or 'two incarnations'}"
                         + (": it showed again what it had shown since its last save." if tool == "app" else
                            "." if tool in ("restart", "slurm") else
                            ": the restored program resumed from the image and showed again what had been shown since."))
        dup = []
    if dup:
        epochs = _senders_of(effects, dup)
        who = _incarnations([e for op in dup for e in epochs.get(op, [])]) or "two incarnations"
        sentences.append(f"The receiver applied {op_ranges(dup)} twice or more, from {who}: "
                         + ("the restored process resumed from the image and sent again what the original had already "
                            "delivered" if fault != "none" else "the resumed process sent again what it had delivered")
                         + (f", and {MODE_WORDS[mode]}." if mode in MODE_WORDS else "."))
    missing = [int(f["op"]) for f in by_kind.pop("missing", []) if isinstance(f.get("op"), int)]
    them = "it" if len(missing) == 1 else "them"
    if missing and all(op in keys for op in missing):
        lost = [keys[op] for op in missing]
        sentences.append(f"The effects at {positions(lost)} never reached {_reader(lost)}: no incarnation showed {them} "
                         f"after the {'start' if tool in ('app', 'restart', 'slurm') else 'restore'}.")
    elif missing:
        sentences.append(f"The workload committed {op_ranges(missing)}, but the receiver never applied {them}: no "
                         f"incarnation delivered {them} after the restore.")
    sentences += _mixed(by_kind.pop("mixed_epoch", []), keys)
    for f in by_kind.pop("restarted", []):
        if not (started and tool == "restart"):  # a requeue starts from the beginning: the opening says so
            sentences.append(f"The restore did not continue the run: {_detail(f)}.")
    for f in by_kind.pop("process_lost", []):
        sentences.append(f"The workload did not survive the tool: {_detail(f)}.{fix}")
    for kind, found in by_kind.items():  # alike findings in one sentence, the first one's detail for them all
        ops = [int(f["op"]) for f in found if isinstance(f.get("op"), int)]
        more = f" ({len(found) - 1} more alike)" if len(found) > 1 else ""
        sentences.append(f"{str(kind).replace('_', ' ').capitalize()}" + (f" at {op_ranges(ops)}" if ops else "")
                         + f": {_detail(found[0])}{more}.")
    return " ".join(sentences)


def resume_flag(meta: dict[str, Any], variant: str = "") -> str:
    """A program's own restart flag as its scenario (``run.toml``'s, the variant's where it has one) gives it
    (``workload.params.resume``, "--resume"); "" for none."""
    scenario = meta.get("scenario") or {}
    for sub in scenario.get("variants") or ():
        if variant and sub.get("variant") == variant:
            scenario = sub
    resume = (scenario.get("params") or {}).get("resume") or []
    return " ".join(map(str, resume)) if isinstance(resume, (list, tuple)) else str(resume)


def _detail(finding: dict[str, Any]) -> str:
    return str(finding.get("detail", "")).rstrip(". ")


def _opening(tool: str, fault: str, where: str, program: bool, resume: str) -> str:
    """The first sentence: what the cut did. A program's own restart and a requeue are no checkpoint of a tool:
    it was killed (or ran on and crashed) and started again, with its own restart flag or from its beginning."""
    if program and tool in ("app", "restart"):
        how = {"kill": f"killed at {where}", "leave_running": f"left running past {where}, then crashed"}.get(
            fault, f"cut at {where}")
        again = ("from its beginning" if tool == "restart" else f"with its own {resume}" if resume
                 else "with its own restart flag")
        return f"The program was {how}, and started again {again}"
    if program and tool == "slurm":  # the job script decides what comes back: the preemption is all cutbench did
        return f"Slurm preempted the program's job at {where} (what came back of it is its job script's doing)"
    opening = f"The {tool} checkpoint was taken at {where}"
    return opening + (f"; {FAULT_WORDS[fault]}" if fault in FAULT_WORDS else "")


def _mixed(found: list[dict[str, Any]], keys: dict[int, tuple[str, str]]) -> list[str]:
    """Sentences for the ``mixed_epoch`` findings: a program's by stream and range, split into effects the
    uninterrupted runs never showed and payloads other than theirs; a workload's alike ones in one sentence."""
    if not found:
        return []
    ops = [int(f["op"]) for f in found if isinstance(f.get("op"), int)]
    if ops and all(op in keys for op in ops):
        never = [keys[int(f["op"])] for f in found if NOT_SHOWN_WORDS in str(f.get("detail", ""))]
        other = [keys[int(f["op"])] for f in found if NOT_SHOWN_WORDS not in str(f.get("detail", ""))]
        out = []
        if never:
            out.append(f"The effects at {positions(never)} are ones the uninterrupted runs never showed there.")
        if other:
            out.append(f"The effects at {positions(other)} carry payloads of another moment than the uninterrupted runs' "
                       f"({_detail(next(f for f in found if NOT_SHOWN_WORDS not in str(f.get('detail', ''))))}).")
        return out
    more = f" ({len(found) - 1} more alike)" if len(found) > 1 else ""
    return [f"State of two moments at {op_ranges(ops) if ops else 'the end'}: {_detail(found[0])}{more}."]


# How the oracle says a program's effect is one the uninterrupted runs never showed (the reference's NOT_SHOWN).
NOT_SHOWN_WORDS = "never showed"
