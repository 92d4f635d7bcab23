"""The store: every disk write of results happens here.

Layout of ``results/<run-id>/``::

    run.toml            resolved scenario, environment, status (complete|partial)
    trials.parquet      one row per trial: arm, plan, status, outcome, finding counts, timings
    timeline.parquet    one row per stage or event, with its CPU-seconds by process role, faults and bytes
                        written (docs/cpu-accounting.md; NaN in a run stored before them)
    effects.parquet     every delivery the receiver recorded, with trial_id
    certificates.parquet one row per recovery-cut certificate (pipeline.certify audit/enforce)
    matrix.parquet      the CUDA support matrix (``cutbench matrix``): one row per probe row, tool and fault
    trials/<id>.json    the trial's spec (for ``cutbench replay``), record and verdict, its timeline and
                        receiver rows (what ``cutbench run --resume`` keeps of it)
    references/<key>.json the ground truth recorded on this machine (workloads with ground_truth = "recorded")
    trials.tar.xz       trials/ and references/ packed into one archive (``cutbench pack``; harness/store/archive.py):
                        every reader below reads a record from it exactly as from its file
    summary.md          the human summary

``results/latest`` is a symlink to the newest run.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd
import tomli_w

from cutbench.errors import InvalidArgument
from cutbench.files import atomic_open, atomic_symlink, atomic_write, read_document
from cutbench.harness.model.timeline import CPU_COLUMNS
from cutbench.harness.store import archive as _archive

if TYPE_CHECKING:
    from cutbench.harness.model.trial import TrialResult

TABLES = ("trials", "timeline", "effects", "certificates", "criteria", "matrix", "deviations")
# Tables every run with trials writes, and the columns each must have (for a damaged directory's error).
REQUIRED_TABLES = ("trials", "timeline", "effects")
REQUIRED_COLUMNS: dict[str, tuple[str, ...]] = {
    "trials": ("trial_id", "arm", "outcome", "status", "receiver_mode", "fault"),
    "timeline": ("trial_id", "stage", "t_start", "t_end"),
    "effects": ("trial_id", "op_id", "decision"),
    "deviations": ("tool", "id", "sequence", "promised", "observed", "reproducer"),
}
# Columns added since runs were first stored: a table of an older run reads with them, as NaN.
LATER_COLUMNS: dict[str, tuple[str, ...]] = {
    "timeline": CPU_COLUMNS,
}


def _unreadable(path: Path, exc: Exception) -> InvalidArgument:
    return InvalidArgument(f"{path}: not a readable Parquet table ({type(exc).__name__}: {exc})")


def _check_columns(path: Path, name: str, columns: Any, rows: int) -> None:
    """A table with rows must have the columns every run writes (an empty one may have none)."""
    missing = [c for c in REQUIRED_COLUMNS.get(name, ()) if rows and c not in columns]
    if missing:
        raise InvalidArgument(f"{path}: lacks column(s) {', '.join(missing)} (a damaged run directory)")


def new_run_id(name: str) -> str:
    """A sortable, unique run ID: ``20261129T130501Z-quick-3fa2``."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    return f"{stamp}-{name}-{secrets.token_hex(2)}"


@dataclass
class RunDir:
    """A run directory being written or read.

    Its per-trial records are files (``trials/<id>.json``, ``references/<key>.json``) as a run writes them,
    or members of ``trials.tar.xz`` once packed (:mod:`~cutbench.harness.store.pack`), or both (a packed run
    resumed): every reader here sees one set of records either way.
    """

    path: Path
    # The archive's members, read once per version of the file: (its mtime and size, the members).
    _packed_cache: tuple[tuple[int, int], dict[str, bytes]] | None = field(default=None, init=False, repr=False,
                                                                          compare=False)

    @property
    def run_id(self) -> str:
        """The run ID (the directory name)."""
        return self.path.name

    @classmethod
    def create(cls, root: str | Path, name: str) -> "RunDir":
        """Make ``root/<new run id>/`` and return it."""
        path = Path(root) / new_run_id(name)
        (path / "trials").mkdir(parents=True)
        return cls(path)

    @classmethod
    def open(cls, path: str | Path) -> "RunDir":
        """Open an existing run directory (``results/latest`` works); raise InvalidArgument if it is not one."""
        p = Path(path).resolve()
        if not (p / "run.toml").is_file():
            raise InvalidArgument(f"{path}: not a cutbench run directory (no run.toml)")
        run = cls(p)
        run.meta()  # a damaged run.toml is named here, before any command reads the run
        return run

    # -- writing ---------------------------------------------------------
    def write_meta(self, meta: dict[str, Any]) -> None:
        """Write ``run.toml`` (None values dropped: TOML has no null)."""
        atomic_write(self.path / "run.toml", tomli_w.dumps(_drop_none(meta)))

    def update_meta(self, **changes: Any) -> None:
        """Merge top-level keys into ``run.toml``."""
        meta = self.meta()
        meta.update(changes)
        self.write_meta(meta)

    def trial_path(self, trial_id: str) -> Path:
        """Where trial ``trial_id``'s file is (``trials/<trial_id>.json``), written or not (packed: read it with
        :func:`read_trial_file`, which finds it in the archive)."""
        return self.path / "trials" / f"{trial_id}.json"

    def write_trial(self, trial_id: str, record: dict[str, Any]) -> Path:
        """Write ``trials/<trial_id>.json`` (atomically: all of it or nothing); return its path."""
        path = self.trial_path(trial_id)
        atomic_write(path, json.dumps(record, indent=2, sort_keys=True, default=str))
        return path

    def write_reference(self, key: str, data: dict[str, Any]) -> Path:
        """Write ``references/<key>.json``, a recorded reference (atomically); return its path."""
        if not key or "/" in key or key.startswith("."):
            raise InvalidArgument(f"reference key {key!r}: expected a file name")
        (self.path / "references").mkdir(exist_ok=True)
        return atomic_write(self.path / "references" / f"{key}.json",
                            json.dumps(data, indent=1, sort_keys=True, default=str))

    def write_table(self, name: str, rows: list[dict[str, Any]] | pd.DataFrame) -> Path:
        """Write ``<name>.parquet`` from rows or a frame; return its path."""
        if name not in TABLES:
            raise InvalidArgument(f"table {name!r}: allowed {', '.join(TABLES)}")
        frame = rows if isinstance(rows, pd.DataFrame) else pd.DataFrame(rows)
        path = self.path / f"{name}.parquet"
        with atomic_open(path) as fh:
            frame.to_parquet(fh, index=False)
        return path

    def write_results(self, results: list["TrialResult"], stages: tuple[str, ...]) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
        """Write the run's tables of ``results`` (trials, timeline, effects, certificates), in plan order (a resumed
        run's kept trials and its new ones come interleaved), the trials with a ``<stage>_s`` column for each of
        ``stages``; return the trials, timeline and effects frames."""
        # Loaded by a writer only: a reader of a stored run (open_run, report) needs neither the rows nor the model.
        from cutbench.harness.store.tables import certificate_rows, trial_row

        results = sorted(results, key=lambda r: r.spec.index)
        trials = pd.DataFrame([trial_row(r, stages) for r in results])
        timeline = pd.DataFrame([row for r in results for row in r.timeline])
        effects_frames = [r.effects.assign(trial_id=r.spec.trial_id) for r in results if not r.effects.empty]
        effects = pd.concat(effects_frames, ignore_index=True) if effects_frames else pd.DataFrame()
        self.write_table("trials", trials)
        self.write_table("timeline", timeline)
        self.write_table("effects", effects)
        self.write_table("certificates", [row for r in results for row in certificate_rows(r)])
        return trials, timeline, effects

    def write_text(self, name: str, text: str) -> Path:
        """Write a text artefact (``summary.md``, ``report.html``) into the run directory."""
        return atomic_write(self.path / name, text)

    def write_bytes(self, name: str, data: bytes) -> Path:
        """Write a binary artefact (a PNG plot) into the run directory."""
        return atomic_write(self.path / name, data)

    def mark_latest(self) -> None:
        """Point ``<root>/latest`` at this run."""
        atomic_symlink(self.path.name, self.path.parent / "latest")

    # -- reading ---------------------------------------------------------
    def meta(self) -> dict[str, Any]:
        """Return ``run.toml`` as a dict; :class:`InvalidArgument` naming the file when it is not readable TOML."""
        import tomllib

        return read_document(self.path / "run.toml", tomllib.loads, what="run file", fmt="TOML",
                             errors=(tomllib.TOMLDecodeError, UnicodeDecodeError))

    def table(self, name: str) -> pd.DataFrame:
        """A stored table; empty when the run stored none (a run with no trial).

        A damaged run directory raises :class:`InvalidArgument` naming the
        file and what is wrong: a table missing although ``run.toml`` counts
        trials, one that is not readable Parquet, or one without the columns
        every run writes.
        """
        path = self._stored(name)
        if path is None:
            return pd.DataFrame()
        try:
            frame = pd.read_parquet(path)
        except Exception as exc:  # pyarrow raises several types for a truncated or foreign file
            raise _unreadable(path, exc) from None
        _check_columns(path, name, frame.columns, len(frame))
        missing = [c for c in LATER_COLUMNS.get(name, ()) if c not in frame.columns]
        if missing and len(frame):
            frame = frame.assign(**dict.fromkeys(missing, float("nan")))
        return frame

    def check_table(self, name: str) -> None:
        """Raise what :meth:`table` would for a damaged table, reading only the file's footer (no rows)."""
        import pyarrow.parquet as pq

        path = self._stored(name)
        if path is None:
            return
        try:
            meta = pq.read_metadata(path)
        except Exception as exc:
            raise _unreadable(path, exc) from None
        _check_columns(path, name, meta.schema.names, meta.num_rows)

    def _stored(self, name: str) -> Path | None:
        """The table's file; None when the run stored none, an error when it should have."""
        path = self.path / f"{name}.parquet"
        if path.exists():
            return path
        trials = self.meta().get("n_trials") if name in REQUIRED_TABLES else None
        if trials:
            raise InvalidArgument(f"{path}: missing, although run.toml counts {trials} trials (a damaged run directory)")
        return None

    def trial_records(self) -> list[dict[str, Any]]:
        """Every trial record (``trials/*.json``, loose or packed), in trial order; :class:`InvalidArgument`
        naming a damaged or foreign one."""
        files = self.record_files("trials")
        meta = self.meta()
        expected, run_id = meta.get("n_trials"), meta.get("run_id", self.run_id)  # a copied run keeps its run_id
        if expected is not None and len(files) != expected:
            where = " and ".join(str(p) for p in (self.path / "trials", self.archive_path) if p.exists())
            raise InvalidArgument(f"{where or self.path / 'trials'}: holds {len(files)} trial files, run.toml counts "
                                  f"{expected} (a damaged run directory)")
        records = []
        for label, raw in files.values():
            data = _trial_document(label, raw)
            if data.get("run_id") not in (None, run_id):
                raise InvalidArgument(f"{label}: belongs to run {data.get('run_id')!r}, not {run_id!r}")
            records.append(data)
        return records

    def references(self) -> dict[str, dict[str, Any]]:
        """Every stored recorded reference (``references/*.json``, loose or packed), by key (none: ``{}``);
        :class:`InvalidArgument` naming a damaged file."""
        out = {}
        for name, (label, raw) in sorted(self.record_files("references").items()):
            data = _json_document(label, raw, "recorded reference")
            if not isinstance(data, dict) or "payloads" not in data:
                raise InvalidArgument(f"{label}: not a recorded reference (no 'payloads')")
            out[name.removesuffix(".json")] = data
        return out

    # -- the records, loose or packed --------------------------------------
    @property
    def archive_path(self) -> Path:
        """Where the run's packed records are (``trials.tar.xz``), packed or not."""
        return self.path / _archive.ARCHIVE

    def loose_records(self) -> list[Path]:
        """The record files not (yet) packed: ``trials/*.json`` in trial order, then ``references/*.json``."""
        return sorted([*(self.path / "trials").glob("*.json"), *(self.path / "references").glob("*.json")],
                      key=lambda p: _archive.member_order(f"{p.parent.name}/{p.name}"))

    def packed_records(self) -> dict[str, bytes]:
        """The members of ``trials.tar.xz`` by name (``trials/t0001.json``); ``{}`` when the run is not packed.
        :class:`InvalidArgument` naming the archive when it is damaged."""
        path = self.archive_path
        try:
            st = path.stat()
        except FileNotFoundError:
            return {}
        version = (st.st_mtime_ns, st.st_size)
        if self._packed_cache is None or self._packed_cache[0] != version:
            self._packed_cache = (version, _archive.read(path))
        return self._packed_cache[1]

    def record_files(self, folder: str) -> dict[str, tuple[str, bytes]]:
        """Every ``<folder>/*.json`` record of the run (``trials`` or ``references``), in trial order, by file name:
        where it is (a path, or ``<run>/trials.tar.xz:trials/t0001.json``) and its bytes.

        A record both packed and loose (a pack interrupted before it removed the files: pack again) must be the
        same bytes; :class:`InvalidArgument` names both when they differ.
        """
        found: dict[str, tuple[str, bytes]] = {}
        for member, raw in self.packed_records().items():
            top, _, name = member.partition("/")
            if top == folder:
                found[name] = (f"{self.archive_path}:{member}", raw)
        for p in sorted((self.path / folder).glob("*.json")):
            raw = p.read_bytes()
            if p.name in found and found[p.name][1] != raw:
                raise InvalidArgument(f"{p}: differs from {found[p.name][0]}, the same record packed "
                                      "(a damaged run directory)")
            found[p.name] = (str(p), raw)
        return dict(sorted(found.items(), key=lambda item: _archive.member_order(f"{folder}/{item[0]}")))


def store_run(run: RunDir, results: list["TrialResult"], record: dict[str, Any], *,
              report: Callable[[RunDir, dict[str, Any], pd.DataFrame, pd.DataFrame, pd.DataFrame], None],
              mark_latest: bool = True) -> pd.DataFrame:
    """Write a run's results: its tables (:meth:`RunDir.write_results`, a stage column for each stage of the
    backends ``record`` names), ``run.toml`` (``record``, the run's rendered metadata), then what ``report``
    writes from them (the reports' room hands it in: the store does not draw); point ``results/latest`` at the
    run unless ``mark_latest`` is false (a replay is a side run). Returns the trials frame."""
    from cutbench.harness.store.tables import stage_columns

    trials, timeline, effects = run.write_results(results, stage_columns(record.get("backends") or {}))
    run.write_meta(record)
    report(run, record, trials, timeline, effects)
    if mark_latest:
        run.mark_latest()
    return trials


def read_matrix(path: str | Path) -> pd.DataFrame:
    """The support matrix stored at ``path``: a run directory holding ``matrix.parquet``, or that file.

    Raises :class:`InvalidArgument` naming the path when there is no matrix there.
    """
    p = Path(path)
    if p.is_dir():
        table = RunDir.open(p).table("matrix")
        if table.empty:
            raise InvalidArgument(f"{p}: holds no support matrix (matrix.parquet): run cutbench matrix, or "
                                  "cutbench matrix --from RUN")
        return table
    if not p.is_file():
        raise InvalidArgument(f"support matrix {str(p)!r} does not exist (a cutbench matrix run directory or its matrix.parquet)")
    try:
        table = pd.read_parquet(p)
    except Exception as exc:
        raise _unreadable(p, exc) from None
    missing = [c for c in ("row", "feature", "tool", "fault", "cell") if c not in table.columns]
    if missing:
        raise InvalidArgument(f"{p}: not a support matrix (lacks column(s) {', '.join(missing)})")
    return table


def read_trial_file(path: str | Path) -> dict[str, Any]:
    """Load one stored trial JSON (for replay); raise InvalidArgument if it is not one.

    ``<run>/trials/<id>.json`` of a packed run is read from ``<run>/trials.tar.xz``: the path a summary or
    report gives for a trial stays the one to replay after ``cutbench pack``.
    """
    p = Path(path)
    packed = p.parent.parent / _archive.ARCHIVE
    if p.parent.name == "trials" and not p.exists() and packed.is_file():
        member = f"trials/{p.name}"
        raw = _archive.read(packed).get(member)
        if raw is None:
            raise InvalidArgument(f"trial file {str(path)!r} does not exist, and {packed} does not hold {member}")
        return _trial_document(f"{packed}:{member}", raw)
    data = read_document(path, json.loads, what="trial file", fmt="JSON", errors=(json.JSONDecodeError, UnicodeDecodeError))
    return _trial_checked(str(path), data)


def _json_document(label: str, raw: bytes, what: str) -> Any:
    """A record's bytes parsed as JSON; :class:`InvalidArgument` naming ``what`` and where it is (``label``)."""
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InvalidArgument(f"{what} {label!r} is not valid JSON: {exc}") from None


def _trial_document(label: str, raw: bytes) -> dict[str, Any]:
    return _trial_checked(label, _json_document(label, raw, "trial file"))


def _trial_checked(label: str, data: Any) -> dict[str, Any]:
    if not isinstance(data, dict) or "spec" not in data:
        raise InvalidArgument(f"{label}: not a cutbench trial file (no 'spec')")
    return data


def as_stored(value: Any) -> Any:
    """Return ``value`` as ``run.toml`` gives it back: tuples as lists, None dropped (to compare a live value with a stored one)."""
    import tomllib

    return tomllib.loads(tomli_w.dumps({"v": _drop_none(value)}))["v"]


def _drop_none(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _drop_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, (list, tuple)):
        return [_drop_none(v) for v in value if v is not None]
    return value
