"""The hunt's pure parts: the documented lifecycle, the invariants, reproducers as text, the stored files."""

from __future__ import annotations

import ast
import subprocess
import sys

import pytest

from cutbench.errors import InvalidArgument
from cutbench.harness.hunt.checker import judge, judge_close
from cutbench.harness.hunt.model import (SOURCES, Step, World, advance, expect, moves, public_report, safe)
from cutbench.harness.hunt import nemesis as hands
from cutbench.harness.hunt import store as findings

LOCK, CKPT, RESTORE, UNLOCK = Step("lock", (("timeout_ms", 5000),)), Step("checkpoint"), Step("restore"), Step("unlock")


@pytest.mark.parametrize("tool", ["cuda", "cuda-checkpoint"])
def test_the_driver_api_lifecycle_is_the_documented_one(tool):
    """RUNNING → lock → LOCKED → checkpoint → CHECKPOINTED → restore → LOCKED → unlock → RUNNING; each call
    is refused in every other state, with the state kept."""
    path = [("running", LOCK, "locked"), ("locked", CKPT, "checkpointed"), ("checkpointed", RESTORE, "locked"),
            ("locked", UNLOCK, "running")]
    for state, step, after in path:
        e = expect(tool, World(state), step)
        assert e.answers == {"ok"} and e.after_ok == after
        for other in ("running", "locked", "checkpointed"):
            if other != state:
                refused = expect(tool, World(other), step)
                assert refused.answers == {"refused"} and refused.after_refused == other
    assert "cuCheckpointProcessRestore" in expect(tool, World("checkpointed"), RESTORE).source


def test_a_restore_into_a_filled_gpu_may_fail_and_keeps_the_process_checkpointed():
    e = expect("cuda", World("checkpointed"), Step("restore_filled"))
    assert e.answers == {"ok", "refused"} and e.after_refused == "checkpointed" and e.after_ok == "locked"
    assert e.source == SOURCES["restore-filled"]


def test_criu_restores_an_image_only_while_its_pid_is_free():
    dumped = advance("criu", World(), Step("criu_dump", (("leave_running", True),)), "ok", "running")
    assert dumped == World("running", "running")
    assert expect("criu", dumped, Step("criu_restore")).answers == {"refused"}
    gone = advance("criu", dumped, Step("kill"), "ok", "gone")
    assert expect("criu", gone, Step("criu_restore")).after_ok == "running"
    # A CHECKPOINTED CUDA process's image comes back CHECKPOINTED.
    assert expect("cuda", World("gone", "checkpointed"), Step("criu_restore")).after_ok == "checkpointed"


def test_moves_split_the_lifecycle_from_the_detours_and_never_offer_what_would_only_wait():
    m = moves("cuda-checkpoint", World("checkpointed"))
    assert [str(s) for s in m["advance"]] == ["restore", "restore_filled", "criu_dump", "criu_dump(leave_running=True)"]
    assert "lock(timeout_ms=5000)" in [str(s) for s in m["detour"]]  # misuse, refused by the documentation
    locked = {s.action for s in safe("cuda", World("locked"))}
    assert not locked & {"step", "alloc", "free"}  # the probe's own work would block while LOCKED
    assert "criu_restore" not in locked  # no image: nothing to ask CRIU
    assert "criu_restore" in {s.action for s in safe("cuda", World("locked", "checkpointed"))}


def test_a_stated_model_replaces_the_documented_promise():
    step = Step("criu_restore")
    world = World("running", "running")
    assert expect("criu", world, step).answers == {"refused"}
    stated = expect("criu", world, step, {"criu_restore@running": "ok"})
    assert stated.answers == {"ok"} and "override" in stated.source


def test_unknown_tools_and_actions_are_named():
    with pytest.raises(InvalidArgument, match="no lifecycle model for tool 'lxc'.*podman"):
        moves("lxc", World())
    with pytest.raises(InvalidArgument, match="unknown action 'teleport'"):
        expect("cuda", World(), Step("teleport"))


def obs(answer, state, **kw):
    return {"answer": answer, "state": state, "detail": kw.pop("detail", answer), **kw}


def test_each_invariant_is_judged_from_what_was_seen():
    running, ckpt = World("running"), World("checkpointed")
    assert judge(running, LOCK, expect("cuda", running, LOCK), obs("ok", "locked")) == []
    [d] = judge(ckpt, RESTORE, expect("cuda", ckpt, RESTORE), obs("refused", "checkpointed", detail="CUDA_ERROR_OPERATING_SYSTEM"))
    assert d.invariant == "documented_transition" and "documented ok → locked" in d.summary
    [d] = judge(running, CKPT, expect("cuda", running, CKPT), obs("refused", "failed"))
    assert d.invariant == "bounded_failure"  # a refusal that moved the process
    [d] = judge(running, LOCK, expect("cuda", running, LOCK), obs("ok", "running"))
    assert d.invariant == "documented_transition"  # a success that left the wrong state
    [d] = judge(running, LOCK, expect("cuda", running, LOCK), obs("hang", "running"))
    assert d.invariant == "bounded_time"
    devs = judge(running, UNLOCK, expect("cuda", World("locked"), UNLOCK),
                 obs("ok", "running", continues=False, continues_detail="buffers hold [(2, 2)], expected [(3, 3)]"))
    assert [x.invariant for x in devs] == ["continues_identically"]
    [d] = judge_close(running, ["pid 12 still holds GPU memory 10 s after it was killed"])
    assert d.invariant == "nothing_left" and judge_close(running, []) == []


def test_one_defect_has_one_signature_whatever_its_pids():
    ckpt = World("checkpointed")
    a, b = (judge(ckpt, Step("criu_dump"), expect("cuda", ckpt, Step("criu_dump")),
                  obs("refused", "checkpointed", detail=f"criu dump: Collect mappings (pid: {p}) failed"))[0]
            for p in (1283, 4655))
    assert a.signature == b.signature
    other = judge(ckpt, RESTORE, expect("cuda", ckpt, RESTORE), obs("refused", "checkpointed"))[0]
    assert other.signature != a.signature


def test_public_reports_are_named_only_where_the_sequence_matches():
    assert public_report("restore", "documented_transition", ["lock", "checkpoint", "restore_filled", "restore"]
                         ).startswith("NVIDIA/cuda-checkpoint#44")
    assert public_report("restore", "documented_transition", ["lock", "checkpoint", "restore"]) == \
        "not found in any public report"


def test_a_reproducer_is_one_file_with_no_cutbench_in_it(tmp_path):
    ckpt = World("checkpointed")
    dev = judge(ckpt, RESTORE, expect("cuda", ckpt, RESTORE), obs("refused", "checkpointed"))[0].to_json()
    dev["step"] = 3
    text = hands.reproducer("cuda", [LOCK, CKPT, Step("restore_filled"), RESTORE], dev, 'cuda-9: a """quoted""" header')
    tree = ast.parse(text)
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert not any(m.startswith(("cutbench", "harness", "workloads")) for m in imported)
    path = tmp_path / "cuda-9.py"
    path.write_text(text)
    # Isolated mode: no cutbench on the path, and it still parses its arguments and knows its sequence.
    p = subprocess.run([sys.executable, "-I", str(path), "--help"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and "restore in checkpointed" in p.stdout
    assert "'restore_filled'" in text or '"restore_filled"' in text


def test_the_stored_hunt_is_read_back_and_a_damaged_one_names_its_file(tmp_path):
    doc = {"tool": "criu", "environment": {}, "search": {"sequences": 3, "steps": 9, "seconds": 1.0},
           "walk": None, "findings": []}
    md = findings.write_hunt(tmp_path, doc)
    assert "No deviation" in md.read_text() and findings.read_hunt(tmp_path)["tool"] == "criu"
    (tmp_path / "hunt.json").write_text("{not json")
    with pytest.raises(InvalidArgument, match="hunt.json: damaged"):
        findings.read_hunt(tmp_path)
    with pytest.raises(InvalidArgument, match="not a hunt directory"):
        findings.read_hunt(tmp_path / "nowhere")


def test_the_cli_names_a_malformed_stated_model():
    from tests.fixtures.run_fixtures import cli

    p = cli("hunt", "--tool", "criu", "--model", "criu_restore=maybe", timeout=60)
    assert p.returncode == 254 and "ACTION@STATE=ok" in p.stderr
    p = cli("hunt", "--tool", "lxc", timeout=60)
    assert p.returncode == 254 and "no lifecycle model for tool 'lxc'" in p.stderr


ENGINE_CKPT, ENGINE_LEAVE = Step("engine_checkpoint"), Step("engine_checkpoint", (("leave_running", True),))
ENGINE_RESTORE, ENGINE_NEW = Step("engine_restore"), Step("engine_restore_new")


@pytest.mark.parametrize("engine", ["docker", "podman"])
def test_a_container_engine_s_documented_lifecycle(engine):
    running = World("running")
    # A checkpoint stops the container, or leaves it running; either way its image holds a running probe.
    assert expect(engine, running, ENGINE_CKPT).after_ok == "gone"
    assert expect(engine, running, ENGINE_LEAVE).after_ok == "running"
    stopped = advance(engine, running, ENGINE_CKPT, "ok", "gone")
    assert stopped == World("gone", "running")
    # Restored from its checkpoint, and again after a kill (one image twice); refused while the container runs.
    assert expect(engine, stopped, ENGINE_RESTORE).answers == {"ok"} and engine in expect(engine, stopped, ENGINE_RESTORE).source
    back = advance(engine, stopped, ENGINE_RESTORE, "ok", "running")
    assert expect(engine, back, ENGINE_RESTORE).answers == {"refused"}
    # Under a new name only once the probe is gone (two probes would answer one command directory): a migration,
    # after which the checkpoint stays with the first container.
    assert ENGINE_NEW not in safe(engine, back) and ENGINE_NEW in safe(engine, stopped)
    assert advance(engine, stopped, ENGINE_NEW, "ok", "running") == World("running")
    assert ENGINE_RESTORE not in safe(engine, World("running"))  # no checkpoint yet: nothing to ask


def test_the_engines_deviations_name_their_public_reports():
    assert public_report("close", "nothing_left", ["engine_checkpoint", "engine_restore", "close"],
                         "1 unpacked checkpoint copies (ctrd-checkpoint*) left in /tmp").startswith("containerd/containerd#10166")
    assert public_report("engine_restore_new", "documented_transition", ["engine_checkpoint", "engine_restore_new"],
                         "refused: docker restore into a new container: Error response from daemon: custom checkpointdir "
                         "is not supported").startswith("moby/moby#37344")
    assert public_report("engine_restore", "documented_transition", ["engine_checkpoint", "engine_restore"],
                         "failed to upload checkpoint to containerd: commit failed: content sha256:x: already exists"
                         ).startswith("moby/moby#42900")
    assert public_report("engine_restore", "documented_transition", ["engine_restore"], "refused: no") == \
        "not found in any public report"


def test_an_engine_s_reproducer_is_the_kit_s_three_files_with_no_cutbench_import():
    text = hands.reproducer("podman", [ENGINE_CKPT, ENGINE_RESTORE], {"step": 1, "summary": "x"}, "podman-1: x")
    tree = ast.parse(text)  # one file: the later kit files' __future__ imports and their imports of the kit dropped
    modules = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    modules |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert not any(m.startswith("cutbench") for m in modules) and "class EngineSession(Session)" in text
    assert text.count("from __future__ import annotations") == 1 and "PROBE = r" in text and "def replay(" in text
    assert text.count("from __future__ import annotations") == 1


def test_the_search_picks_the_probe_and_where_among_its_phases_a_step_falls():
    """A GPU tool's sequences start one of three probes (the kit's and the model's lists are one list); every tool
    may leave a step at its launch, its work still in flight when the next step comes, under the README's promise
    that a suspend completes already-submitted work."""
    from cutbench.harness.hunt.model import ALPHABETS, GPU_PROBES, probes
    from cutbench.harness.nemesis.probe_kit import PROBES

    assert probes("cuda") == probes("criu-cuda-plugin") == GPU_PROBES == PROBES["gpu"]
    assert probes("criu") == probes("docker") == PROBES["cpu"] == ("buffers",)
    launch = Step("step", (("k", 2), ("phase", "launch")))
    assert all(launch in ALPHABETS[tool] for tool in ALPHABETS)
    e = expect("cuda", World(), launch)
    assert e.answers == {"ok"} and e.after_ok == "running" and "already-submitted CUDA work" in e.source
    assert launch not in safe("cuda", World("locked"))  # the probe's own work, only while RUNNING


def test_a_reproducer_starts_the_probe_its_sequence_was_found_on(tmp_path):
    ckpt = World("checkpointed")
    dev = judge(ckpt, RESTORE, expect("cuda", ckpt, RESTORE), obs("refused", "checkpointed"))[0].to_json()
    dev["step"] = 2
    text = hands.reproducer("cuda", [LOCK, CKPT, RESTORE], dev, "cuda-9", probe="streams")
    assert "PROBE_VARIANT = 'streams'" in text and "main(TOOL, SEQUENCE, DEVIATION, PROBE_VARIANT)" in text
    row = {"id": "cuda-9", "deviation": dev, "probe": "streams", "sequence": [], "sequence_text": ["lock"],
           "first_at": {"search": 1}, "reproducer": "repro/cuda-9.py", "standalone": [], "public_report": "x"}
    doc = {"tool": "cuda", "environment": {}, "search": {"sequences": 3, "steps": 9, "seconds": 1.0,
                                                           "probes": {"buffers": 1, "streams": 2}},
           "walk": None, "findings": [row]}
    text = findings.render(doc)
    assert "the streams probe" in text and "probes: buffers 1, streams 2" in text


def test_a_restore_onto_another_gpu_is_taken_only_where_there_are_two():
    """The driver API's restore with a GPU UUID pair is a lifecycle step of the ``cuda`` tool, documented to leave
    the process LOCKED; a machine with one GPU never draws it."""
    other = Step("restore_other_gpu")
    ckpt = World("checkpointed")
    e = expect("cuda", ckpt, other)
    assert e.answers == {"ok"} and e.after_ok == "locked" and "remap the process old GPUs" in e.source
    assert expect("cuda", World("locked"), other).answers == {"refused"}
    assert other not in safe("cuda", ckpt) and other not in safe("cuda", ckpt, gpus=1)
    assert other in moves("cuda", ckpt, gpus=2)["advance"]
    assert other not in safe("cuda-checkpoint", ckpt, gpus=2)  # the utility's restore takes no GPU pairs here
