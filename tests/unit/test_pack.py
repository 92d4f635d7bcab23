"""``cutbench pack``: a run's per-trial records in one ``trials.tar.xz``, read by every reader as the loose files were.

In process, on a copy of a small committed run (``results/reference/matrix-cpu``: 24 trials and 4 recorded
references, re-judged in a fraction of a second), with its records laid out as loose files as a run writes them.
"""

from __future__ import annotations

import io
import json
import re
import shutil
import tarfile
from pathlib import Path
from types import SimpleNamespace

import pytest

import cutbench
from cutbench.errors import InvalidArgument
from cutbench.harness.runner import replay as replay_module
from cutbench.harness.store import archive
from cutbench.harness.store.pack import pack
from cutbench.harness.store.rundir import RunDir, as_stored, read_trial_file
from tests.conftest import REPO

SOURCE = REPO / "results" / "reference" / "matrix-cpu"
RECORDS = 28  # 24 trials and 4 recorded references


@pytest.fixture
def loose(tmp_path: Path) -> Path:
    """A copy of the reference run with its records as loose files (unpacked, if the committed run is packed)."""
    run = tmp_path / "run"
    shutil.copytree(SOURCE, run)
    packed = run / archive.ARCHIVE
    if packed.exists():
        for name, raw in archive.read(packed).items():
            (run / name).parent.mkdir(exist_ok=True)
            (run / name).write_bytes(raw)
        packed.unlink()
    return run


def test_a_packed_run_reads_as_its_loose_files(loose: Path):
    before = cutbench.open_run(loose)
    records = {tid: before.trial(tid) for tid in before.trial_ids}
    references = RunDir.open(loose).references()
    result = pack(loose)
    assert result.moved == result.records == RECORDS and 0 < result.archive_bytes < result.loose_bytes / 5
    assert not (loose / "trials").exists() and not (loose / "references").exists()
    assert (loose / "run.toml").is_file() and (loose / "trials.parquet").is_file() and (loose / "summary.md").is_file()
    after = cutbench.open_run(loose)
    assert after.trial_ids == list(records) and {tid: after.trial(tid) for tid in after.trial_ids} == records
    assert RunDir.open(loose).references() == references and len(references) == 4
    check = after.reanalyze()
    assert len(check.rows) == 24 and check.differences == []


def test_packing_a_packed_run_changes_nothing(loose: Path):
    pack(loose)
    data = (loose / archive.ARCHIVE).read_bytes()
    again = pack(loose)
    assert again.moved == 0 and again.records == RECORDS and "already packed" in again.text()
    assert (loose / archive.ARCHIVE).read_bytes() == data


def test_a_record_written_after_packing_is_read_beside_the_archive_and_packed_next_time(loose: Path):
    """A packed run resumed (or a pack interrupted before its removals): loose and packed records are one set."""
    pack(loose)
    whole = (loose / archive.ARCHIVE).read_bytes()
    members = archive.read(loose / archive.ARCHIVE)
    last = members.pop("trials/t0024.json")
    archive.write(loose / archive.ARCHIVE, members)
    (loose / "trials").mkdir()
    (loose / "trials" / "t0024.json").write_bytes(last)
    assert cutbench.open_run(loose).trial_ids[-1] == "t0024"
    assert pack(loose).moved == 1 and (loose / archive.ARCHIVE).read_bytes() == whole  # the same records, the same bytes


def test_replay_reads_a_packed_trial_from_the_archive(loose: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The path a summary printed (``<run>/trials/<id>.json``) still replays once the file is in the archive."""
    pack(loose)
    path = loose / "trials" / "t0003.json"
    assert not path.exists()
    stored = read_trial_file(path)
    assert stored["spec"]["trial_id"] == "t0003"
    ran: list = []

    def execute(scenario, specs, results_root, options=None):  # the rerun itself needs CRIU: tests/criu/test_replay.py
        ran.extend(specs)
        run = SimpleNamespace(path=tmp_path, trial_records=lambda: [{"verdict": stored["verdict"]}])
        return SimpleNamespace(run=run, exit_code=lambda: 0)

    monkeypatch.setattr(replay_module, "execute", execute)
    result = replay_module.replay(path, tmp_path / "out")
    assert [s.trial_id for s in ran] == ["t0003"]
    rerun = as_stored(ran[0].to_dict())
    rerun["arm"] = {k: v for k, v in rerun["arm"].items() if k in stored["spec"]["arm"]}  # an axis added since aside
    assert {k: rerun.get(k) for k in stored["spec"]} == as_stored(stored["spec"])  # the stored spec, fields added since aside
    assert result.reproduced and result.exact
    with pytest.raises(InvalidArgument, match=r"t9999.json' does not exist, and .*trials.tar.xz does not hold trials/t9999.json"):
        read_trial_file(loose / "trials" / "t9999.json")


@pytest.mark.parametrize("damage, says", [
    (lambda raw: raw[: len(raw) // 2], "not a readable trial archive (EOFError"),
    (lambda raw: b"not an archive", "not a readable trial archive (ReadError"),
    (lambda raw: b"", "not a readable trial archive"),
])
def test_a_damaged_archive_is_named(loose: Path, damage, says):
    pack(loose)
    path = loose / archive.ARCHIVE
    path.write_bytes(damage(path.read_bytes()))
    for read in (cutbench.open_run, pack, lambda p: read_trial_file(p / "trials" / "t0001.json")):
        with pytest.raises(InvalidArgument) as caught:
            read(loose)
        assert str(caught.value).startswith(f"{path}: ") and says in str(caught.value)


def test_a_damaged_or_foreign_member_is_named_with_its_archive(loose: Path):
    pack(loose)
    path = loose / archive.ARCHIVE
    members = archive.read(path)
    archive.write(path, {**members, "trials/t0002.json": members["trials/t0002.json"][:50]})
    with pytest.raises(InvalidArgument, match=re.escape(f"trial file '{path}:trials/t0002.json' is not valid JSON")):
        cutbench.open_run(loose)
    with pytest.raises(InvalidArgument, match="not a trial or reference record"):
        archive.write(path, {**members, "notes.txt": b"hello"})
    with tarfile.open(path, "w:xz") as tar:  # what no pack writes: a foreign member
        info = tarfile.TarInfo("../escape.json")
        info.size = 2
        tar.addfile(info, io.BytesIO(b"{}"))
    with pytest.raises(InvalidArgument, match=re.escape(f"{path}: holds '../escape.json', which is not a trial or reference record")):
        cutbench.open_run(loose)


def test_pack_refuses_a_damaged_run_naming_the_file_and_changes_nothing(loose: Path):
    bad = loose / "trials" / "t0005.json"
    bad.write_text(bad.read_text()[:40])
    with pytest.raises(InvalidArgument, match="t0005.json' is not valid JSON"):
        pack(loose)
    assert not (loose / archive.ARCHIVE).exists() and len(list((loose / "trials").glob("*.json"))) == 24
    bad.unlink()
    with pytest.raises(InvalidArgument, match="holds 23 trial files, run.toml counts 24"):
        pack(loose)
    meta = loose / "run.toml"
    meta.write_text(meta.read_text().replace('status = "complete"', 'status = "running"'))
    with pytest.raises(InvalidArgument, match=r"run.toml: status 'running'"):
        pack(loose)
    assert not (loose / archive.ARCHIVE).exists()


def test_a_record_packed_and_loose_that_differ_is_named(loose: Path):
    pack(loose)
    member = archive.read(loose / archive.ARCHIVE)["trials/t0001.json"]
    (loose / "trials").mkdir()
    changed = json.loads(member)
    changed["verdict"]["outcome"] = "invalid"
    (loose / "trials" / "t0001.json").write_text(json.dumps(changed))
    with pytest.raises(InvalidArgument, match=r"t0001.json: differs from .*trials.tar.xz:trials/t0001.json"):
        pack(loose)


def test_the_command_packs_and_reports_an_error_by_name(loose: Path):
    from click.testing import CliRunner

    from cutbench.harness.integrations.cli import cli

    result = CliRunner().invoke(cli, ["pack", "--json", str(loose)])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["moved"] == RECORDS
    (loose / archive.ARCHIVE).write_bytes(b"")
    result = CliRunner().invoke(cli, ["pack", str(loose)])
    assert isinstance(result.exception, InvalidArgument) and str(loose / archive.ARCHIVE) in str(result.exception)
