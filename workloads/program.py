"""``program``: a program that knows nothing of cutbench, judged from what it shows the outside world.

A scenario names the program's command, the files it starts with, and the
stream the harness watches (its stdout, its stderr or a file it appends to,
such as a log); an **effects rule** turns each line of that stream into an
effect with an identity, ``(stream, index, payload)``: a regular expression
with a named group ``index`` (and ``payload``; the whole line otherwise), or
a parser named by import path. ``streams`` adds more pipes or files, each
with its own rule (:meth:`Program.watched`). The program imports nothing of cutbench and
cutbench imports nothing of the program; the harness side of it (starting
the program with its stream piped to a reader outside the checkpointed tree,
the readers, the cuts at the k-th effect) is
:mod:`cutbench.harness.runner.program`. See docs/programs.md.

Its ground truth is recorded (``ground_truth = "recorded"``): two
uninterrupted runs on this machine must show the same effects, in the same
order, and leave the same final artefacts (``artefacts``: by digest, or by
a comparison callable within a stated tolerance: :class:`Artefact`). A
trial's effects are then numbered by the reference's order (op *i* is the
*i*-th effect of the uninterrupted run), so the oracle's findings
(duplicate, missing, mixed_epoch) read as they do for any workload, with the
stream and index named.

A parser is a callable made fresh for each program start (``parser =
"module:factory"``, the module found in the scenario's folder): ``factory()``
returns a callable that takes one line (without its newline) and returns the
effects it completes, as ``(index, payload)`` pairs (none for most lines). It
imports nothing of cutbench either.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from cutbench.errors import WorkloadError

# Where a program's effects come from: its standard output or error, a file (relative to its directory), or
# what a server streams back to cutbench's own clients (HTTP: see the ``http`` parameter).
PIPES: tuple[str, ...] = ("stdout", "stderr")
FILE_PREFIX = "file:"
HTTP = "http"
SOCKET = "socket"  # the program connects to cutbench on 127.0.0.1:{port} and writes its lines there
# What a client does when its stream breaks (the server went away mid-response).
RETRY_POLICIES: tuple[str, ...] = ("give_up", "same_id", "new_id")
# The load generator's settings (``http``), with their defaults.
HTTP_DEFAULTS: dict[str, Any] = {
    "requests": 8,  # requests in all, numbered 1..requests
    "concurrency": 4,  # at once: a new one is admitted as one ends, while the others are mid-stream
    "path": "/generate",
    "body": '{"id": "{id}", "n": {n}}',  # POSTed as JSON; {id}: the request's id (r1, r2, ...), {n}: its number
    "retry": "give_up",  # after a broken stream: give up, send it again with the same id, or as a new request
}

# Under the ``slurm`` backend: the program runs as a batch job, started by the job script ``script`` (its command
# as the script's arguments; docs/slurm.md), in partition ``partition``; the cut is a preemption (``preempt``): a job
# of ``hold_s`` seconds in the higher partition ``preemptor`` that needs the node ("partition"), or
# ``scontrol requeue`` ("requeue"). A job that is not running within ``pending_s`` is a refused trial.
SLURM_DEFAULTS: dict[str, Any] = {
    "script": "",
    "partition": "low",
    "preemptor": "high",
    "preempt": "partition",
    "hold_s": 1.0,
    "pending_s": 60.0,
}
PREEMPTIONS: tuple[str, ...] = ("partition", "requeue")

# What an entry of ``streams`` holds: the stream, and its rule (one of the two).
STREAM_KEYS: tuple[str, ...] = ("stream", "effects", "parser")

# A parser: one line in, the effects it completes out.
LineParser = Callable[[str], Iterable[tuple[Any, Any]]]


def _check_rule(params: dict[str, Any], where: str) -> None:
    """Raise :class:`WorkloadError` unless ``params`` (the scenario's, or an entry of ``streams``, named ``where``)
    gives exactly one effects rule: a regular expression that compiles, or a parser named ``module:factory``."""
    if bool(params["effects"]) == bool(params["parser"]):
        raise WorkloadError(f"{where}: give exactly one effects rule: effects = a regular expression "
                            "(named groups index, payload) or parser = \"module:factory\"")
    if params["effects"]:
        try:
            re.compile(params["effects"])
        except re.error as exc:
            raise WorkloadError(f"{where}.effects = {params['effects']!r}: not a regular expression ({exc})") from None
    elif ":" not in params["parser"]:
        raise WorkloadError(f"{where}.parser = {params['parser']!r}: expected 'module:factory'")


def digest(text: str) -> str:
    """The payload digest of an effect whose payload is ``text`` (what the reference compares)."""
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


class RegexRule:
    """The effects rule of a regular expression: one effect per matching line.

    ``index`` is the match's group ``index`` where the pattern has one, else the count of matches so far
    (from 1); ``payload`` its group ``payload``, else the whole line.
    """

    def __init__(self, pattern: str):
        self.pattern = re.compile(pattern)
        self.count = 0

    def __call__(self, line: str) -> list[tuple[Any, Any]]:
        match = self.pattern.search(line)
        if match is None:
            return []
        self.count += 1
        groups = match.groupdict()
        index = groups.get("index") if groups.get("index") is not None else self.count
        payload = groups.get("payload") if groups.get("payload") is not None else line.strip()
        return [(index, payload)]


def scenario_import(target: str, search: str, what: str) -> Any:
    """Return ``module:name`` imported, the module found in ``search`` (the scenario's folder) first; raises what the
    import raises (the callers name the parameter)."""
    from cutbench.registry import import_target
    from cutbench.workloads.api import add_import_path

    if search:
        add_import_path([search])
    return import_target(target, what)


@dataclass(frozen=True)
class Artefact:
    """A final file of the program, compared with the reference run's copy.

    Without ``compare`` its bytes must be equal (by digest). With ``compare = "module:function"`` (the module in
    the scenario's folder), ``function(reference, candidate)`` takes the two files' paths and returns how far
    apart they are, a number: equal when it is at most ``tolerance`` (a final structure's largest coordinate
    difference, a model's largest parameter difference). It imports nothing of cutbench.
    """

    path: str
    compare: str = ""
    tolerance: float = 0.0

    def load(self, search: str) -> Callable[[Path, Path], float]:
        """The comparison callable, its module found in ``search``; :class:`WorkloadError` naming it when it
        cannot be imported."""
        try:
            function = scenario_import(self.compare, search, "artefact comparison")
        except Exception as exc:
            raise WorkloadError(f"workload.params.artefacts: {self.path}: compare = {self.compare!r} cannot be "
                                f"imported ({type(exc).__name__}: {exc})") from None
        if not callable(function):
            raise WorkloadError(f"workload.params.artefacts: {self.path}: compare = {self.compare!r} is not callable")
        return function  # type: ignore[no-any-return]


class Program:
    """The ``program`` workload (see the module docstring): parameters and their checks, nothing that runs."""

    name: ClassVar[str] = "program"
    # What a plain process holds (its memory and files open): CRIU's. A program that keeps more (files it
    # rewrites, a GPU) says so with the ``domains`` parameter.
    domains: ClassVar[frozenset[str]] = frozenset({"cpu"})
    # Where a cut lands, with no instrumentation in the program: after the k-th effect the outside world saw
    # ("effect"), k x cut_time_ms after the program started ("time"), or once k x cut_bytes of its stream were
    # read ("size"; for a file stream: the file reached that size). A program cannot park, so every cut is
    # asynchronous: it lands there (plus the plan's async offset), wherever the program then is.
    # Or just before its k-th counted system call ("syscall": the program traced, held there; asked for by name, so
    # that plan.phases = "all" traces nothing).
    phases: ClassVar[tuple[str, ...]] = ("effect", "time", "size", "syscall")
    arrays: ClassVar[tuple[str, ...]] = ("numpy",)  # no array library of cutbench's: the harness starts no CUDA for it
    ground_truth: ClassVar[str] = "recorded"
    # Started by the harness as it is (cutbench.harness.runner.program), not as a workload class in a workload process.
    program: ClassVar[bool] = True
    defaults: ClassVar[dict[str, Any]] = {
        "command": [],  # argv; the first word found on PATH or a path (relative: in the program's directory)
        "env": {},  # variables added to the harness's environment (to the image's, with ``image``)
        # Under docker or podman: the program's own image (one the engine holds), its command run in it as it is,
        # only the trial's directory mounted; "" runs it in cutbench's image with the host's /usr mounted.
        "image": "",
        "files": [],  # copied into the program's directory before it starts (relative: to the scenario's folder)
        "stream": "stdout",  # "stdout", "stderr", "file:PATH" (a file it appends to), "socket" or "http" (it serves)
        "http": {},  # for stream "http": the load generator's settings (HTTP_DEFAULTS)
        "slurm": {},  # under the slurm backend: its job script, partitions and preemption (SLURM_DEFAULTS)
        # For stream "http": where it listens; for "socket": where cutbench listens for it. Written for "{port}" in
        # its command (0: a free one).
        "port": 0,
        "effects": "",  # a regular expression (named groups: index, payload), or ...
        "parser": "",  # ... "module:factory", the module in the scenario's folder (parser_path)
        # More streams the outside world sees, each with its own rule: tables { stream = "stderr" or "file:PATH",
        # effects = "REGEX" } or { stream = ..., parser = "module:factory" } (STREAM_KEYS).
        "streams": [],
        "parser_path": "",  # where the parser's and comparisons' modules are found (empty: the scenario's folder)
        "ops": 1,  # effects the cuts choose among (plan.ops lies within 1..ops)
        # Files it leaves (relative to its directory), compared with the reference's: a name, by digest; or a table
        # { path = "...", compare = "module:function", tolerance = X } (Artefact).
        "artefacts": [],
        "resume": [],  # its own restart flag, appended to the command by the `app` backend (GROMACS: -cpi md.cpt)
        "domains": [],  # state domains it keeps beyond a plain process's (e.g. "disk")
        # The file its own checkpoint (or its job script's) writes, relative to its directory: under
        # pipeline.certify its mtime dates the image (docs/certificates.md, "Programs"). "" for none.
        "checkpoint_file": "",
        "cut_time_ms": 100.0,  # a cut at op k of phase "time" lands k x this after the program started
        "cut_bytes": 4096,  # a cut at op k of phase "size" lands once k x this many bytes of its stream were read
        # The system calls that count, traced from its start (plan.syscalls, where plan.phases has "syscall"): [] for
        # none, an untraced program.
        "syscalls": [],
    }

    def __init__(self, rt: Any, params: dict[str, Any]) -> None:
        raise WorkloadError("a program is started as it is, never as a workload class (cutbench.harness.runner.program)")

    def run_op(self, op: int) -> None:
        """Never called: see ``__init__``."""

    @classmethod
    def validate_params(cls, params: dict[str, Any]) -> None:
        """Raise :class:`WorkloadError` naming the first bad parameter and its fix."""
        command = params["command"]
        if not command or not all(isinstance(w, str) and w for w in command):
            raise WorkloadError("workload.params.command: give the program's command line as a list of words, "
                                "e.g. command = [\"python3\", \"serve.py\"]")
        cls.artefacts(params)
        for key in ("files", "resume", "domains", "syscalls"):
            if not all(isinstance(v, str) and v for v in params[key]):
                raise WorkloadError(f"workload.params.{key} = {params[key]!r}: a list of non-empty strings")
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in params["env"].items()):
            raise WorkloadError(f"workload.params.env = {params['env']!r}: an inline table of strings, e.g. "
                                "env = { OMP_NUM_THREADS = \"1\" }")
        stream = params["stream"]
        if stream not in (*PIPES, HTTP, SOCKET) and not cls.stream_file(stream):
            raise WorkloadError(f"workload.params.stream = {stream!r}: allowed {', '.join(map(repr, PIPES))}, "
                                "'file:PATH' (a file the program appends to, relative to its directory), 'socket' "
                                "(it connects to cutbench on 127.0.0.1:{port}) or 'http' (a server cutbench's clients "
                                "stream from)")
        checkpoint_file = params["checkpoint_file"]
        if not isinstance(checkpoint_file, str) or checkpoint_file.startswith("/") or ".." in Path(checkpoint_file).parts:
            raise WorkloadError(f"workload.params.checkpoint_file = {checkpoint_file!r}: a path within the program's "
                                "directory, e.g. \"criu-images/inventory.img\"")
        if params["slurm"]:
            cls.slurm_settings(params)
        if stream == HTTP:
            cls.http_settings(params)
            if not any("{port}" in word for word in command):
                raise WorkloadError("workload.params.command: a server's command says where it listens with "
                                    "\"{port}\", e.g. [\"python3\", \"serve.py\", \"--port\", \"{port}\"]")
        if stream == SOCKET and not any("{port}" in word for word in command):
            raise WorkloadError("workload.params.command: with stream = \"socket\" the command says where the "
                                "program connects with \"{port}\" (cutbench listens on 127.0.0.1 there), e.g. "
                                "[\"python3\", \"train.py\", \"--metrics\", \"127.0.0.1:{port}\"]")
        if not 0 <= params["port"] <= 65535:
            raise WorkloadError(f"workload.params.port = {params['port']}: 0 (a free one) or a port number")
        _check_rule(params, "workload.params")
        cls.watched(params)
        for key in ("cut_time_ms", "cut_bytes"):
            value = params[key]
            if not value > 0:  # NaN too
                raise WorkloadError(f"workload.params.{key} = {value!r}: a number > 0 (the unit of a cut at op k "
                                    f"of phase {'time' if key == 'cut_time_ms' else 'size'})")
        if params["ops"] < 1:
            raise WorkloadError(f"workload.params.ops = {params['ops']}: the effects the cuts choose among, >= 1")
        from cutbench.workloads.api import DOMAINS

        unknown = sorted(set(params["domains"]) - set(DOMAINS))
        if unknown:
            raise WorkloadError(f"workload.params.domains: unknown {unknown}; allowed {', '.join(DOMAINS)}")

    @staticmethod
    def artefacts(params: dict[str, Any]) -> list[Artefact]:
        """The final artefacts the scenario names, checked; :class:`WorkloadError` naming a bad entry and its fix."""
        out = []
        for entry in params["artefacts"]:
            if isinstance(entry, str) and entry:
                out.append(Artefact(entry))
                continue
            fix = ('give a file name, or { path = "model.pt", compare = "compare:max_abs", tolerance = 1e-6 } '
                   "(compare: module:function, in the scenario's folder)")
            if not isinstance(entry, dict) or set(entry) - {"path", "compare", "tolerance"}:
                raise WorkloadError(f"workload.params.artefacts: {entry!r}: {fix}")
            path, compare, tolerance = entry.get("path"), entry.get("compare", ""), entry.get("tolerance", 0.0)
            if not isinstance(path, str) or not path or not isinstance(compare, str) or (compare and ":" not in compare):
                raise WorkloadError(f"workload.params.artefacts: {entry!r}: {fix}")
            if isinstance(tolerance, bool) or not isinstance(tolerance, (int, float)) or not tolerance >= 0:
                raise WorkloadError(f"workload.params.artefacts: {path}: tolerance = {tolerance!r}: a number >= 0")
            if "tolerance" in entry and not compare:
                raise WorkloadError(f"workload.params.artefacts: {path}: a tolerance needs a compare = "
                                    "\"module:function\" (without one the file is compared by digest)")
            out.append(Artefact(path, compare, float(tolerance)))
        for artefact in out:
            if Path(artefact.path).is_absolute() or ".." in Path(artefact.path).parts:
                raise WorkloadError(f"workload.params.artefacts: {artefact.path!r}: a path relative to the program's "
                                    "directory, within it")
        return out

    @staticmethod
    def http_settings(params: dict[str, Any]) -> dict[str, Any]:
        """The load generator's settings: ``params["http"]`` over :data:`HTTP_DEFAULTS`, checked; raises
        :class:`WorkloadError` naming the bad one."""
        given = params.get("http") or {}
        unknown = sorted(set(given) - set(HTTP_DEFAULTS))
        if unknown:
            raise WorkloadError(f"workload.params.http: unknown {unknown}; allowed {', '.join(HTTP_DEFAULTS)}")
        out = {**HTTP_DEFAULTS, **given}
        for key in ("requests", "concurrency"):
            if not isinstance(out[key], int) or isinstance(out[key], bool) or out[key] < 1:
                raise WorkloadError(f"workload.params.http.{key} = {out[key]!r}: an integer >= 1")
        for key in ("path", "body"):
            if not isinstance(out[key], str) or not out[key]:
                raise WorkloadError(f"workload.params.http.{key} = {out[key]!r}: a non-empty string")
        if out["retry"] not in RETRY_POLICIES:
            raise WorkloadError(f"workload.params.http.retry = {out['retry']!r}: allowed {', '.join(RETRY_POLICIES)}")
        return out

    @staticmethod
    def slurm_settings(params: dict[str, Any]) -> dict[str, Any]:
        """The ``slurm`` backend's settings: ``params["slurm"]`` over :data:`SLURM_DEFAULTS`, checked; raises
        :class:`WorkloadError` naming the bad one and its fix."""
        given = params.get("slurm") or {}
        unknown = sorted(set(given) - set(SLURM_DEFAULTS))
        if unknown:
            raise WorkloadError(f"workload.params.slurm: unknown {unknown}; allowed {', '.join(SLURM_DEFAULTS)}")
        out = {**SLURM_DEFAULTS, **given}
        if not isinstance(out["script"], str) or not out["script"]:
            raise WorkloadError("workload.params.slurm.script: the job script that starts the program, e.g. "
                                'script = "examples/slurm/requeue-resume.sh" (docs/slurm.md)')
        for key in ("partition", "preemptor"):
            if not isinstance(out[key], str) or not out[key]:
                raise WorkloadError(f"workload.params.slurm.{key} = {out[key]!r}: a partition's name")
        if out["partition"] == out["preemptor"]:
            raise WorkloadError(f"workload.params.slurm: partition and preemptor are both {out['partition']!r}; the "
                                "preemptor is a partition of higher priority that can take the node")
        if out["preempt"] not in PREEMPTIONS:
            raise WorkloadError(f"workload.params.slurm.preempt = {out['preempt']!r}: allowed {', '.join(PREEMPTIONS)}")
        for key in ("hold_s", "pending_s"):
            value = out[key]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise WorkloadError(f"workload.params.slurm.{key} = {value!r}: a number of seconds > 0")
        return out

    @classmethod
    def domains_for(cls, params: dict[str, Any]) -> frozenset[str]:
        """The domains the scenario says the program keeps beyond a plain process's."""
        return frozenset(params.get("domains") or ())

    @classmethod
    def anchor(cls, params: dict[str, Any], base: Path) -> dict[str, Any]:
        """Return ``params`` with the paths a scenario wrote relative to its folder ``base`` made absolute (``files``,
        the parser's folder), so that a trial, a replay or a resume finds them from anywhere."""
        out = dict(params)
        out["files"] = [str((base / f).resolve()) for f in params["files"]]
        if params["slurm"].get("script"):  # checked already (slurm_settings): a table, its script a string
            out["slurm"] = {**params["slurm"], "script": str((base / params["slurm"]["script"]).resolve())}
        parsers = params["parser"] or any(isinstance(e, dict) and e.get("parser") for e in params["streams"])
        if (parsers or any(a.compare for a in cls.artefacts(params))) and not params["parser_path"]:
            out["parser_path"] = str(base.resolve())
        return out

    @staticmethod
    def command_for(params: dict[str, Any], port: int) -> list[str]:
        """The program's command with ``{port}`` written as ``port`` (a server's)."""
        return [word.replace("{port}", str(port)) for word in params["command"]]

    @staticmethod
    def stream_file(stream: str) -> str | None:
        """The file a stream reads (relative to the program's directory: ``file:PATH``), or None for another kind."""
        return stream[len(FILE_PREFIX):] if stream.startswith(FILE_PREFIX) else None

    @staticmethod
    def watched(params: dict[str, Any]) -> dict[str, dict[str, Any]]:
        """Every stream the outside world sees of the program, the scenario's ``stream`` first, then ``streams``:
        each mapped to the parameters its effects rule is made from (:meth:`rule`). Raises :class:`WorkloadError`
        naming a bad entry of ``streams`` and its fix."""
        out = {params["stream"]: params}
        fix = ('give tables { stream = "stderr", effects = "REGEX" } or { stream = "file:PATH", parser = '
               '"module:factory" }: more pipes or files the program writes to, each with its own rule')
        for i, entry in enumerate(params["streams"]):
            where = f"workload.params.streams[{i}]"
            if not isinstance(entry, dict) or set(entry) - set(STREAM_KEYS) or not isinstance(entry.get("stream"), str):
                raise WorkloadError(f"{where} = {entry!r}: {fix}")
            stream = entry["stream"]
            if stream not in PIPES and not Program.stream_file(stream):
                raise WorkloadError(f"{where}.stream = {stream!r}: {', '.join(map(repr, PIPES))} or 'file:PATH' (a "
                                    "socket or a server is the scenario's one stream)")
            if stream in out:
                raise WorkloadError(f"{where}.stream = {stream!r}: watched already; each stream once")
            rule = {**params, "effects": entry.get("effects", ""), "parser": entry.get("parser", "")}
            _check_rule(rule, where)
            out[stream] = rule
        return out

    @staticmethod
    def rule(params: dict[str, Any]) -> LineParser:
        """A fresh effects rule for one start of the program: the regular expression's, or the parser's factory
        called. Raises :class:`WorkloadError` naming the parser when it cannot be imported or made."""
        if params["effects"]:
            return RegexRule(params["effects"])
        try:
            parser = scenario_import(params["parser"], params["parser_path"], "effects parser")()
        except Exception as exc:
            raise WorkloadError(f"workload.params.parser = {params['parser']!r}: cannot make a parser "
                                f"({type(exc).__name__}: {exc})") from None
        if not callable(parser):
            raise WorkloadError(f"workload.params.parser = {params['parser']!r}: the factory returned "
                                f"{type(parser).__name__}, not a callable taking one line")
        return parser

    @staticmethod
    def missing_command(params: dict[str, Any]) -> str | None:
        """Why the program's command cannot be started (its first word not found or not executable), or None.
        A command in the program's own image (``image``) is the image's to find."""
        first = params["command"][0]
        if os.sep in first or params["image"]:
            return None  # relative to the program's directory (one of its files): checked when it starts
        env_path = dict(os.environ, **params["env"]).get("PATH", os.defpath)
        if shutil.which(first, path=env_path) is None:
            return f"command {first!r} not found on PATH ({env_path})"
        return None

    @staticmethod
    def missing_files(params: dict[str, Any]) -> list[str]:
        """The files the program starts with that do not exist."""
        return [f for f in params["files"] if not Path(f).exists()]


def artefacts_digest(directory: Path, artefacts: list[Artefact], within: dict[str, bool] | None = None) -> str:
    """One digest of the program's final artefacts under ``directory`` (each name and its bytes; an absent one
    as absent), or of nothing when it names none. An artefact compared by a callable counts as equal to the
    reference's when ``within[path]`` says it is within its tolerance, by its bytes otherwise."""
    h = hashlib.blake2b(digest_size=16)
    for artefact in artefacts:
        h.update(artefact.path.encode() + b"\0")
        if artefact.compare and (within or {}).get(artefact.path):
            h.update(b"\0within tolerance\0")
            continue
        try:
            h.update((directory / artefact.path).read_bytes())
        except OSError:
            h.update(b"\0absent\0")
    return h.hexdigest()
