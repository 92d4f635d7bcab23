"""The scenario schema is the one place a field is declared (harness/model/schema.py).

- ``scenarios/README.md``'s field tables are ``python -m cutbench.harness.model.schema --markdown``;
- the parser, ``Scenario``, ``TrialSpec``, ``CutContext``, the gate's trial keywords and the support
  matrix's scenario take their defaults from it, so an empty file loads to the schema's defaults;
- a bad value of any field gives a message that names the field and says what it takes instead.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from pathlib import Path
from typing import Any

import pytest

from cutbench.errors import InvalidArgument
from cutbench.harness.matrix import generator as matrix
from cutbench.harness.integrations import gate
from cutbench.harness.model import schema
from cutbench.harness.model.scenario import ARM_AXES, Arm, Scenario, parse_scenario
from cutbench.harness.model.trial import TrialSpec
from cutbench.harness.nemesis.base import CutContext
from cutbench.harness.store.rundir import as_stored

REPO = Path(__file__).resolve().parents[2]
README = REPO / "scenarios" / "README.md"
BEGIN = re.compile(r"^<!-- The tables from here to the end marker are the output of .*?-->\n", re.M | re.S)
END = "<!-- End of the tables made from harness/model/schema.py. -->"
# Scenario attributes that are no field of a file: where it was read from, and the variant it is.
NOT_FIELDS = {"source_path", "variant", "variants"}


def readme_tables() -> str:
    """The text between the README's two markers (what the schema printed when it was pasted)."""
    text = README.read_text()
    begin = BEGIN.search(text)
    assert begin and END in text, f"{README}: the markers around the generated tables are gone"
    return text[begin.end():text.index(END)].strip("\n")


def test_the_readme_tables_are_the_schemas():
    expected = schema.markdown().strip("\n")
    assert readme_tables() == expected, (
        "scenarios/README.md's field tables differ from harness/model/schema.py: replace the text between the "
        "markers with the output of `python -m cutbench.harness.model.schema --markdown`")


def test_the_command_prints_the_tables(capsys):
    assert schema.main(["--markdown"]) == 0
    assert capsys.readouterr().out == schema.markdown()


def test_the_readme_error_examples_are_the_parsers():
    text = README.read_text()
    for data in ({"pipeline": {"faults": ["explode"]}}, {"plan": {"phase": ["admit"]}}):
        with pytest.raises(InvalidArgument) as info:
            parse_scenario(data)
        assert f"error: {info.value}\n" in text


def test_every_field_is_declared_once_and_well():
    keys = [f.key for f in schema.FIELDS]
    assert len(keys) == len(set(keys))
    for f in schema.FIELDS:
        assert f.help and "\n" not in f.help and "|" not in f.help, f"{f.key}: help must be one Markdown table cell"
        assert f.section in ("",) + schema.SECTIONS, f.key
        if "{choices}" in f.help or f.meanings:
            assert not callable(f.choices) and f.choices, f"{f.key}: {{choices}} needs a fixed list of choices"
            assert set(f.meanings) <= set(f.choices), f"{f.key}: meanings of values it does not take"
        if f.kind in (schema.CHOICE, schema.CHOICES):
            assert f.default is not None and all(v in f.allowed() for v in (f.default if f.kind == schema.CHOICES else (f.default,)))
        elif f.attr and f.kind != schema.CUSTOM and f.default is not None:
            assert schema.check(f, _as_toml(f.default)) == f.default, f"{f.key}: its default is not a value it takes"


def _as_toml(value: Any) -> Any:
    return [_as_toml(v) for v in value] if isinstance(value, tuple) else value


def test_scenario_takes_every_default_from_the_schema():
    attrs = {f.attr: f for f in schema.FIELDS if f.attr}
    declared = {f.name: f for f in dataclasses.fields(Scenario)}
    assert set(declared) - NOT_FIELDS == set(attrs), "a Scenario attribute without a schema field, or the reverse"
    for attr, f in attrs.items():
        d = declared[attr]
        if attr == "params":
            assert d.default_factory() == f.default
        elif attr not in ("name", "plan_phases"):  # the file's stem; the workload's phases
            assert d.default == f.default, f"Scenario.{attr} = {d.default!r}, the schema says {f.default!r}"


def test_an_empty_file_is_the_schemas_defaults():
    scen = parse_scenario({}, "some/where.toml")
    for f in schema.FIELDS:
        if f.attr and f.attr not in ("name", "params", "plan_phases"):
            assert getattr(scen, f.attr) == f.default, f.key
    assert scen.name == "where" and scen.plan_phases  # the stem; every phase of the workload
    assert parse_scenario({"run": {"executor": "ray"}}).jobs == "auto"  # the one default that depends on another field


def test_the_runner_side_takes_its_defaults_from_the_schema():
    spec = {f.name: f.default for f in dataclasses.fields(TrialSpec)}
    ctx = {f.name: f.default for f in dataclasses.fields(CutContext)}
    mat = {k: p.default for k, p in inspect.signature(matrix.scenario).parameters.items()}
    d = schema.default
    for key in ("watchdog_s", "trial_timeout_s", "stage_timeout_s", "prepare_timeout_s"):
        assert spec[key] == d(f"run.{key}")
    assert (spec["images_dir"], spec["keep_images"]) == (d("pipeline.images_dir"), d("pipeline.keep_images"))
    assert (ctx["stage_timeout_s"], ctx["prepare_timeout_s"]) == (d("run.stage_timeout_s"), d("run.prepare_timeout_s"))
    assert (mat["jobs"], mat["stage_timeout_s"], mat["images_dir"]) == (d("run.jobs"), d("run.stage_timeout_s"),
                                                                        d("pipeline.images_dir"))


def test_the_gate_trial_keywords_are_scenario_fields_and_set_what_they_name():
    for key in gate.TRIAL_KEYWORDS.values():
        schema.lookup(key)  # KeyError for a field that does not exist
    scen = gate.trial_scenario(None, workload="counter", fault="leave_running", crash_after_ms=250, params={"ops": 5},
                               certify="audit", trial_timeout_s=30)
    assert (scen.workload, scen.faults, scen.crash_after_ms, scen.params["ops"], scen.certify, scen.trial_timeout_s) == \
        ("counter", ("leave_running",), (250.0,), 5, ("audit",), 30.0)
    with pytest.raises(InvalidArgument, match="no workload named"):
        gate.trial_scenario(None, fault="kill")
    with pytest.raises(InvalidArgument, match="unknown keyword.*colour"):
        gate.trial_scenario(None, workload="counter", colour="red")


def test_one_arm_of_a_scenario_keeps_every_axis_certify_included():
    arm_fields = {f.name for f in dataclasses.fields(Arm)} - {"crash_choices", "split_choices"}
    assert set(ARM_AXES) == arm_fields
    assert set(ARM_AXES.values()) == {schema.lookup(k).attr for k in schema.arm_keys()}
    scen = parse_scenario({"workload": {"name": "counter"}, "pipeline": {"certify": ["audit", "enforce"],
                                                                           "faults": ["kill", "none"]}})
    assert len(scen.arms()) == 4
    for arm in scen.arms():
        assert scen.narrowed(arm).arms() == [arm]
        assert gate.restrict(scen, arm).arms() == [arm]


def test_limits_are_the_fields_bounds():
    for f in schema.FIELDS:
        if f.high is not None and f.kind != schema.MS:
            assert schema.LIMITS[f.key] == f.high
    assert schema.LIMITS["pipeline.ms"] == schema.lookup("pipeline.crash_after_ms").high


def bad_values(f: schema.Field) -> list[tuple[Any, str]]:
    """Values field ``f`` refuses, each with the part of the message that says what to give instead."""
    out: list[tuple[Any, str]] = []
    if f.kind == schema.TEXT:
        out.append((3, "expected str"))
    elif f.kind == schema.FLAG:
        out.append(("yes", "expected bool"))
    elif f.kind == schema.MAPPING:
        out.append(([1], "expected dict"))
    elif f.kind == schema.CHOICE:
        out += [(1, "expected str"), ("bogus", "allowed " + ", ".join(f.allowed()))]
    elif f.kind == schema.CHOICES:
        out += [(["bogus"], "allowed " + ", ".join(f.allowed())), ([], "give at least one of")]
    elif f.kind == schema.MS:
        out += [("10", "expected list or int or float"), ([-1], "expected numbers >= 0"), ([f.high + 1], f"in 0..{f.high}")]
    elif f.kind in (schema.INTEGER, schema.NUMBER):
        out.append(("1", "expected int" if f.kind == schema.INTEGER else "expected int or float"))
        if f.kind == schema.INTEGER:
            out.append((1.5, "expected int"))
        if f.positive:
            out.append((0, "must be > 0"))
        if f.high is not None:
            out.append((f.high + 1, f"{f.high}"))
        if f.low is not None:
            out.append((f.low - 1, f"in {f.low}..{f.high}"))
    return out


GENERIC = [(f, value, fix) for f in schema.FIELDS if f.attr for value, fix in bad_values(f)]


@pytest.mark.parametrize("f, value, fix", GENERIC, ids=[f"{f.key}={v!r}" for f, v, _ in GENERIC])
def test_a_bad_value_names_the_field_and_the_fix(f: schema.Field, value: Any, fix: str):
    data: dict[str, Any] = {f.name: value} if not f.section else {f.section: {f.name: value}}
    with pytest.raises(InvalidArgument) as info:
        parse_scenario(data)
    message = str(info.value)
    assert message.startswith(f.key + " "), message
    assert fix in message, message


@pytest.mark.parametrize("data, field, fix", [
    ({"plan": {"ops": [0, 1]}}, "plan.ops", f"1 <= first <= last <= {schema.MAX_OPS:,}"),
    ({"plan": {"ops": [1, 2, 3]}}, "plan.ops", "expected [first, last]"),
    ({"plan": {"ops": "1"}}, "plan.ops", "expected list"),
    ({"plan": {"phases": "some"}}, "plan.phases", 'use "all" or a list of admit'),
    ({"run": {"jobs": 0}}, "run.jobs", f"1 to {schema.MAX_JOBS}"),
    ({"run": {"jobs": "many"}}, "run.jobs", '"auto"'),
    ({"run": {"ray_address": "h:1"}}, "run.ray_address", 'only read with run.executor = "ray"'),
    ({"receiver": {"store": "mysql://x"}}, "receiver.store", "allowed 'sqlite', 'sqlite:PATH' or a postgresql:// URL"),
    ({"workload": {"name": "nope"}}, "workload.name", "counter"),
    ({"workload": {"params": {"opz": 3}}}, "workload.params", "allowed: "),
    ({"plan": {"phase": ["admit"]}}, "plan.phase", "allowed in [plan]: " + ", ".join(schema.keys("plan"))),
    ({"runs": {}}, "runs", "allowed in the top level: " + ", ".join(schema.keys(""))),
    ({"run": 3}, "run", "expected a table [run]"),
])
def test_a_bad_value_of_a_field_of_its_own_form_names_it_and_the_fix(data: dict[str, Any], field: str, fix: str):
    with pytest.raises(InvalidArgument) as info:
        parse_scenario(data)
    assert field in str(info.value) and fix in str(info.value), str(info.value)


def test_the_top_level_keys_name_every_table():
    assert set(schema.SECTIONS) == {"workload", "receiver", "pipeline", "plan", "run"}
    assert schema.keys("") == ("name", "description", "include", *schema.SECTIONS, "variants")


def test_a_typo_in_the_shared_tables_is_not_blamed_on_a_variant():
    shared_typo = {"workload": {"name": "counter", "parms": {"ops": 4}},
                   "variants": [{"name": "a"}, {"name": "b", "workload": {"params": {"ops": 5}}}]}
    with pytest.raises(InvalidArgument) as info:
        parse_scenario(shared_typo)
    assert str(info.value).startswith("unknown field 'workload.parms'") and "every variant shares" in str(info.value)
    own_typo = {"workload": {"name": "counter"}, "variants": [{"name": "a"}, {"name": "b", "workload": {"parms": {}}}]}
    with pytest.raises(InvalidArgument, match=r"^variants\[1\] \(b\): unknown field 'workload.parms'"):
        parse_scenario(own_typo)


def test_a_workload_class_that_is_not_one_is_named_with_the_protocol_s_page():
    from cutbench.workloads import api

    with pytest.raises(api.WorkloadError, match=r"lacks 'run_op'.*docs/workload-api.md"):
        api.load("tests.unit.test_scenario_schema:NotAWorkload")
    assert api.load("tests.unit.test_scenario_schema:RecordedWithoutModel").name == "recorded_without_model"


class NotAWorkload:
    name, domains, phases, defaults = "not_a_workload", frozenset({"cpu"}), ("admit",), {"ops": 2}

    @classmethod
    def reference(cls, params):
        return None


class RecordedWithoutModel:
    """Ground truth recorded from uninterrupted runs: no ``reference`` (docs/workload-api.md says so)."""

    name, domains, phases, defaults = "recorded_without_model", frozenset({"cpu"}), ("admit",), {"ops": 2}
    ground_truth = "recorded"

    def run_op(self, op):
        return None


def test_a_workload_records_where_its_module_was_found_and_cutbench_s_own_records_nothing(tmp_path, monkeypatch):
    import sys

    from cutbench.workloads import api

    assert api.import_roots(api.load("counter")) == () and api.import_roots(api.load("outbox")) == ()
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "book.py").write_text("from cutbench.workloads.counter import Counter\n\n\n"
                                              "class Book(Counter):\n    name = 'book'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "path", list(sys.path))
    assert api.import_roots(api.load("pkg.book:Book")) == (str(tmp_path),)


def test_a_trial_spec_carries_its_arm_as_the_one_type_and_stores_it_as_a_table():
    from cutbench.harness.model.plan import CutPlan
    from cutbench.harness.model.trial import spec_for

    scen = parse_scenario({"workload": {"name": "counter"}, "pipeline": {"certify": ["audit"], "faults": ["kill"]}})
    arm = scen.arms()[0]
    spec = spec_for(scen, arm, CutPlan(()), 1)
    assert spec.arm is arm and spec.arm.certify == "audit"
    stored = spec.to_dict()
    assert isinstance(stored["arm"], dict) and TrialSpec.from_dict(stored).arm == arm
    old = {**stored, "arm": {k: v for k, v in stored["arm"].items() if k not in ("certify", "restore_target")}}
    assert TrialSpec.from_dict(old).arm.certify == schema.default("pipeline.certify")[0]  # a run stored before them
    with pytest.raises(InvalidArgument, match="differ from its arm"):
        TrialSpec.from_dict({**stored, "backend": "restart"})
    with pytest.raises(InvalidArgument, match="arm: unknown field"):
        TrialSpec.from_dict({**stored, "arm": {**stored["arm"], "colour": "red"}})


def test_criu_options_are_an_arm_axis_of_the_backends_that_run_criu():
    # One list is one arm; a list of lists is one arm each ("with and without", side by side).
    both = parse_scenario({"pipeline": {"backends": ["criu", "docker", "app"], "criu_options": [[], ["--file-locks"]]}})
    assert both.criu_options == ((), ("--file-locks",))
    arms = {(a.backend, a.criu_options) for a in both.arms()}
    # app runs no CRIU: it has one arm, without them.
    assert arms == {("criu", ()), ("criu", ("--file-locks",)), ("docker", ()), ("docker", ("--file-locks",)), ("app", ())}
    assert Arm("criu", "idempotent", "kill", 0.0, 0.0, criu_options=("--file-locks", "--link-remap")).label() == \
        "criu/idempotent/kill/criu:file-locks+link-remap"
    assert parse_scenario({"pipeline": {"criu_options": []}}).criu_options == ((),)  # none, as [[]] says
    one = parse_scenario({"pipeline": {"criu_options": ["--ghost-limit=64M"]}})
    assert one.criu_options == (("--ghost-limit=64M",),) and one.arms()[0].criu_options == ("--ghost-limit=64M",)
    # Kept through run.toml: a resumed run's arms are the same.
    assert Scenario.from_dict(as_stored(both.to_dict())).arms() == both.arms()


@pytest.mark.parametrize("value, says", [
    ("--file-locks", "expected a list of options, or a list of such lists"),
    ([["file-locks"]], "contains 'file-locks': write each as \"--name\" or \"--name=value\""),
    ([["--ghost-limit", "64M"]], "contains '64M'"),
    ([[], ["--leave-running"]], "contains '--leave-running': cutbench sets --leave-running itself"),
])
def test_a_bad_criu_option_names_the_field_and_the_fix(value, says):
    with pytest.raises(InvalidArgument, match=re.escape(says)):
        parse_scenario({"pipeline": {"criu_options": value}})
