"""A program's certificates from its evidence (``harness/runner/program_certifier.py``): the effects seen and
its files against its checkpoint file's time, and the decision a requeued job reads. Real files, no process."""

from __future__ import annotations

import os
from pathlib import Path

from cutbench.harness.model.plan import Cut
from cutbench.harness.runner.program_certifier import ProgramCertifier

IMAGE = "criu-images/inventory.img"


def make(tmp_path: Path, *, seen: list[tuple[float, int]], certify_mode: str = "enforce", mode: str = "idempotent",
         decision_file: str = "cutbench-decision", domains: tuple[str, ...] = ("cpu", "disk")) -> ProgramCertifier:
    return ProgramCertifier(
        index=0, cut=Cut(op=5, phase="effect", fault="kill"), receiver_mode=mode, certify_mode=certify_mode,
        phases=("effect",), domains=domains, covers=("cpu", "disk"), seen=lambda: list(seen), directory=tmp_path,
        checkpoint_file=IMAGE, ignore=frozenset({"slurm-job.out"}), decision_file=decision_file, certificates=[])


def program_dir(tmp_path: Path, *, image_at: float, files: dict[str, float]) -> None:
    """The image and the program's files, each written at its unix time."""
    for name, at in {IMAGE: image_at, **files}.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(name)
        os.utime(path, (at, at))


def test_an_image_of_one_moment_with_its_files_is_restored(tmp_path: Path):
    program_dir(tmp_path, image_at=1000.0, files={"jobs.db": 999.0, "slurm-job.out": 1005.0, "criu-images/dump.log": 1001.0})
    certifier = make(tmp_path, seen=[(990.0, 1), (995.0, 2), (999.5, 3)])
    certifier.checkpointed()
    assert certifier.before_restore() is None
    assert certifier.certificate is not None and certifier.certificate.eligible
    assert certifier.certificate.application_epoch == "3/-"  # the effects seen before the image was written
    assert (tmp_path / "cutbench-decision").read_text() == "restore\n"
    certifier.restored()
    assert certifier.certificates[-1]["restored"] is True


def test_files_written_after_the_image_make_a_requeued_job_start_again(tmp_path: Path):
    # The job script dumped with --leave-running: the program ran on, committed, and showed more.
    program_dir(tmp_path, image_at=1000.0, files={"jobs.db": 999.0, "jobs.db-wal": 1002.0})
    certifier = make(tmp_path, seen=[(999.0, 1), (1000.01, 2), (1001.0, 3), (1002.0, 4)])
    certifier.checkpointed()
    assert certifier.before_restore() is None  # the job script decides, not the pipeline
    cert = certifier.certificate
    assert cert is not None and not cert.eligible and "jobs.db-wal written after the image" in cert.reason
    assert cert.application_epoch == "2/-"  # read within READ_LAG_S of the image: written before it
    assert (tmp_path / "cutbench-decision").read_text() == "restart\n"
    assert certifier.evidence_of()["written_after"] == ["jobs.db-wal"]
    certifier.restored()
    assert certifier.certificates[-1]["restored"] is False  # started again, not restored


def test_audit_restores_whatever_the_certificate_says(tmp_path: Path):
    program_dir(tmp_path, image_at=1000.0, files={"jobs.db-wal": 1002.0})
    certifier = make(tmp_path, seen=[(999.0, 1)], certify_mode="audit")
    assert certifier.before_restore() is None and not certifier.certificate.eligible
    assert (tmp_path / "cutbench-decision").read_text() == "restore\n"


def test_without_a_decision_file_enforce_refuses_the_restore(tmp_path: Path):
    program_dir(tmp_path, image_at=1000.0, files={"jobs.db-wal": 1002.0})
    certifier = make(tmp_path, seen=[(999.0, 1)], decision_file="")
    refusal = certifier.before_restore()
    assert refusal is not None and refusal.startswith("certificate: disk: jobs.db-wal")
    assert not (tmp_path / "cutbench-decision").exists()


def test_under_at_least_once_effects_seen_after_the_image_are_sent_again(tmp_path: Path):
    program_dir(tmp_path, image_at=1000.0, files={})
    certifier = make(tmp_path, seen=[(999.0, 1), (1001.0, 2)], mode="at_least_once", domains=("cpu",))
    certifier.before_restore()
    assert certifier.certificate is not None and not certifier.certificate.eligible
    assert certifier.certificate.in_flight == {2: "escaped"}


def test_no_checkpoint_file_leaves_the_position_of_the_capture(tmp_path: Path):
    certifier = make(tmp_path, seen=[(999.0, 1), (1001.0, 2)], domains=("cpu",))
    certifier.captured("criu_freeze")
    certifier.before_restore()
    assert certifier.certificate is not None and certifier.certificate.eligible
    assert certifier.certificate.application_epoch == "2/-"
