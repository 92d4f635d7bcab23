"""The program workload's pure parts: its parameters, effects rules, the GROMACS log parser, how a program's effects
are numbered by the reference, and how findings name the stream and index (docs/programs.md)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pandas as pd
import pytest

from cutbench.errors import InvalidArgument
from cutbench.harness.checker import oracle
from cutbench.harness.model.scenario import parse_scenario
from cutbench.harness.model.trial import TrialRecord
from cutbench.harness.observer.streams import Observer, Seen, _unread
from cutbench.workloads import api
from cutbench.workloads.program import Program, RegexRule, digest
from tests.conftest import REPO

GROMACS = REPO / "examples" / "programs" / "gromacs"


def params(**over):
    return api.resolve_params(Program, {"command": ["prog"], "effects": r"^step (?P<index>\d+)", **over})


@pytest.mark.parametrize("over, names", [
    ({"command": []}, "workload.params.command"),
    ({"stream": "stdin"}, "workload.params.stream"),
    ({"stream": "file:"}, "workload.params.stream"),
    ({"parser": "mod:make"}, "exactly one effects rule"),
    ({"effects": "", "parser": ""}, "exactly one effects rule"),
    ({"effects": "(unclosed"}, "workload.params.effects"),
    ({"effects": "", "parser": "no_colon"}, "workload.params.parser"),
    ({"ops": 0}, "workload.params.ops"),
    ({"domains": ["gpu-ish"]}, "workload.params.domains"),
    ({"env": {"A": 1}}, "workload.params.env"),
    ({"stream": "socket"}, 'with stream = "socket" the command says where the program connects with "{port}"'),
    ({"cut_time_ms": 0}, "workload.params.cut_time_ms = 0: a number > 0"),
    ({"artefacts": [3]}, "workload.params.artefacts: 3: give a file name, or { path ="),
    ({"artefacts": [{"path": "m.pt", "compare": "no_colon"}]}, "workload.params.artefacts: {'path': 'm.pt'"),
    ({"artefacts": [{"path": "m.pt", "compare": "c:f", "tolerance": -1}]}, "m.pt: tolerance = -1: a number >= 0"),
    ({"artefacts": [{"path": "m.pt", "tolerance": 0.1}]}, "m.pt: a tolerance needs a compare"),
    ({"artefacts": ["../up.txt"]}, "'../up.txt': a path relative to the program's directory, within it"),
    ({"cut_time_ms": float("nan")}, "workload.params.cut_time_ms = nan: a number > 0"),
    ({"cut_bytes": -1}, "workload.params.cut_bytes = -1: a number > 0"),
    ({"checkpoint_file": "/tmp/img"}, "workload.params.checkpoint_file = '/tmp/img': a path within the program's"),
    ({"checkpoint_file": "../img"}, "workload.params.checkpoint_file = '../img': a path within the program's"),
])
def test_bad_program_parameters_name_the_field(over, names):
    with pytest.raises(api.WorkloadError, match=names.replace(".", r"\.")):
        params(**over)


def test_a_regex_rule_takes_index_and_payload_groups_else_counts_and_takes_the_line():
    rule = RegexRule(r"^step (?P<index>\d+) (?P<payload>\w+)$")
    assert rule("step 7 abc") == [("7", "abc")] and rule("noise") == []
    plain = RegexRule("tick")
    assert plain("tick one ") == [(1, "tick one")] and plain("x") == [] and plain("tick two") == [(2, "tick two")]


def _gmx_parser():
    spec = importlib.util.spec_from_file_location("gmx_log", GROMACS / "gmx_log.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.Energies()


LOG = """\
           Step           Time
            100        0.20000

Writing checkpoint, step 100 at Thu Dec  3 20:14:07 2026

   Energies (kJ/mol)
        LJ (SR)   Coulomb (SR)      Potential
    9.06618e+02   -4.63865e+03   -3.73203e+03
  Conserved En.    Temperature
    5.34556e+03    7.18372e+02

           Step           Time
            200        0.40000

   Energies (kJ/mol)
        LJ (SR)
    7.18956e+02

	<======  ###############  ==>
	<====  A V E R A G E S  ====>
   Energies (kJ/mol)
        LJ (SR)
    8.00000e+02

"""


def test_the_gromacs_parser_makes_one_effect_per_energy_record_and_ignores_the_rest():
    parser = _gmx_parser()
    out = [e for line in LOG.splitlines() for e in parser(line)]
    assert out == [(100, "9.06618e+02 -4.63865e+03 -3.73203e+03 5.34556e+03 7.18372e+02"), (200, "7.18956e+02")]


def _seen(key, incarnation, payload="p"):
    stream, index = key.split("#")
    return Seen(0.0, incarnation, key, stream, index, digest(payload), payload)


def test_effects_are_numbered_by_the_reference_and_a_repeat_is_a_further_attempt(tmp_path):
    obs = Observer(params(), tmp_path)
    obs.seen = [_seen("stdout#1", 0), _seen("stdout#2", 0), _seen("stdout#2", 1), _seen("stdout#9", 1)]
    frame = obs.frame("run/t1", {"stdout#1": 1, "stdout#2": 2, "stdout#3": 3})
    assert frame["op_id"].tolist() == [1, 2, 2, 4]  # never shown uninterrupted: after the reference's ops
    assert frame["attempt"].tolist() == [1, 1, 2, 1] and frame["sender"].tolist() == [0, 0, 1, 1]
    assert set(frame["decision"]) == {"applied"} and frame["index"].tolist() == ["1", "2", "2", "9"]
    # A control run: numbered as first seen.
    assert obs.frame("run/ref", None)["op_id"].tolist() == [1, 2, 2, 3]


def _reference(obs_frame):
    return api.RecordedReference.from_run("program", {}, "numpy", obs_frame,
                                          {"host_op": int(obs_frame["op_id"].max()), "checksum": "c"})


def test_a_program_s_reference_names_each_op_and_its_findings_say_the_stream_and_index(tmp_path):
    obs = Observer(params(), tmp_path)
    obs.seen = [_seen("stdout#1", 0, "a"), _seen("stdout#2", 0, "b"), _seen("stdout#3", 0, "c")]
    ref = _reference(obs.frame("r", None))
    assert ref.keys == {1: "stdout#1", 2: "stdout#2", 3: "stdout#3"}
    assert api.RecordedReference.from_dict(ref.to_dict()) == ref
    # A trial that saw effect 2 twice and an effect the reference never held, with a different payload.
    obs.seen = [_seen("stdout#1", 0, "a"), _seen("stdout#2", 0, "b"), _seen("stdout#2", 1, "b"),
                _seen("stdout#3", 1, "c"), _seen("stdout#4", 1, "d")]
    effects = obs.frame("t", {v: k for k, v in ref.keys.items()})
    record = TrialRecord(status="completed", restores=1, cut_outcomes=[{"status": "restored"}],
                         report={"host_op": 3, "checksum": "c"}, workload_domains=["cpu"], covered_domains=["cpu"])
    verdict = oracle.judge(record, effects, ref)
    details = {(f.kind, f.op): f.detail for f in verdict.findings}
    assert details[("duplicate", 2)].endswith("[stdout#2]")
    assert details[("mixed_epoch", 4)].endswith("[an effect the uninterrupted runs never showed]")
    assert api.NOT_SHOWN[:12] in details[("mixed_epoch", 4)]


def test_two_recordings_that_disagree_name_the_first_differing_effect(tmp_path):
    obs = Observer(params(), tmp_path)
    obs.seen = [_seen("stdout#1", 0, "a"), _seen("stdout#2", 0, "b")]
    one = _reference(obs.frame("r", None))
    obs.seen = [_seen("stdout#1", 0, "a"), _seen("stdout#2", 0, "B")]
    other = _reference(obs.frame("r", None))
    assert one.first_difference(other).startswith("op 2 (stdout#2): effect payload")
    obs.seen = [_seen("stdout#1", 0, "a"), _seen("stdout#3", 0, "b")]
    assert _reference(obs.frame("r", None)).first_difference(one) == "op 2: effect stdout#3 in one run, stdout#2 in the other"


def test_a_tailed_file_is_read_on_from_where_it_stopped_and_again_from_the_line_where_it_differs(tmp_path):
    log = tmp_path / "log"
    log.write_bytes(b"a 1\nb 2\nc 3\n")
    with open(log, "rb") as fh:
        assert _unread(fh, 12, b"a 1\nb 2\n") == (8, b"c 3\n")  # grown: only what is new is read
    with open(log, "rb") as fh:
        assert _unread(fh, 12, b"a 1\nb 9\n") == (4, b"b 2\nc 3\n")  # rewritten from its second line
    with open(log, "rb") as fh:
        assert _unread(fh, None, b"a 1\n") == (0, b"a 1\nb 2\nc 3\n")  # another file: all of it


def _scenario(tmp_path: Path, **plan) -> dict:
    return {"workload": {"name": "program", "params": {"command": ["python3", "p.py"], "files": ["p.py"],
                                                       "parser": "mine:make"}},
            "pipeline": {"backends": ["restart"], "faults": ["kill"]},
            "plan": {"ops": [1, 1], "phases": ["effect"], **plan}}


def test_a_program_scenario_must_cut_asynchronously(tmp_path):
    with pytest.raises(InvalidArgument, match=r"plan\.cut_mode = 'precise': a program cannot park"):
        parse_scenario(_scenario(tmp_path), source_path=str(tmp_path / "s.toml"))


def test_a_program_s_files_and_parser_are_found_beside_its_scenario(tmp_path):
    scen = parse_scenario(_scenario(tmp_path, cut_mode="async"), source_path=str(tmp_path / "sub" / "s.toml"))
    assert scen.params["files"] == [str((tmp_path / "sub" / "p.py").resolve())]
    assert scen.params["parser_path"] == str((tmp_path / "sub").resolve())
    assert Program.missing_command({**scen.params, "command": ["no-such-program-here"]}).startswith("command 'no-such")


def test_effects_frame_columns_are_the_receiver_s_and_the_program_s(tmp_path):
    frame = Observer(params(), tmp_path).frame("t", None)
    assert isinstance(frame, pd.DataFrame) and frame.empty
    assert {"op_id", "digest", "decision", "epoch", "sender", "stream", "index", "payload"} <= set(frame.columns)


def test_an_idempotent_outside_world_keeps_an_effect_once_unless_it_was_shown_another_value(tmp_path):
    obs = Observer(params(), tmp_path)
    obs.seen = [_seen("stdout#1", 0, "a"), _seen("stdout#1", 1, "a"), _seen("stdout#2", 0, "b"), _seen("stdout#2", 1, "B")]
    frame = obs.frame("t", None, "idempotent")
    assert frame["decision"].tolist() == ["applied", "suppressed", "applied", "applied"]
    assert set(frame["mode"]) == {"idempotent"}
    assert obs.frame("t", None)["decision"].tolist() == ["applied"] * 4


def test_a_program_s_outside_world_is_never_fenced(tmp_path):
    with pytest.raises(InvalidArgument, match="receiver.modes: a program's outside world"):
        parse_scenario({**_scenario(tmp_path, cut_mode="async"), "receiver": {"modes": ["fenced"]}},
                       source_path=str(tmp_path / "s.toml"))


def test_a_backend_that_cannot_cut_a_held_program_refuses_syscall_cuts_before_any_trial_saying_why():
    """criu-cuda-plugin declares why it cannot cut a program held at a system call (``held_calls``): a scenario that
    asks for it is refused by the checks, on any machine, naming the backends that can."""
    from cutbench.harness.runner.checks import check_backends

    data = {"workload": {"name": "program", "params": {"command": ["python3", "-c", "print('step 1 a')"],
                                                       "effects": r"^step (?P<index>\d+) (?P<payload>\w+)$",
                                                       "ops": 1}},
            "pipeline": {"backends": ["criu-cuda-plugin"], "skip_unavailable": True},
            "plan": {"phases": ["syscall"], "ops": [1, 1], "cut_mode": "async"}}
    with pytest.raises(InvalidArgument, match="plan.phases has \"syscall\" under 'criu-cuda-plugin': its plugin takes "
                                              "the CUDA lock inside CRIU's dump.*cuda\\+criu or cuda-checkpoint\\+criu"):
        check_backends(parse_scenario(data))
