"""The test suite's own rules (docs/development.md, "Test tiers"): a test module imports no other test module, and
takes fixtures from pytest (``pytest_plugins`` in tests/conftest.py), never by importing them from tests/fixtures."""

from __future__ import annotations

import ast
import importlib

import pytest

from tests.conftest import REPO, pytest_plugins

TESTS = REPO / "tests"
TIERS = ("unit", "service", "criu", "gpu")


def _imports(path) -> list[tuple[str, list[str]]]:
    """(module, names) of every import statement in ``path``, function-local ones included."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.module, [alias.name for alias in node.names]))
    return out


def _is_fixture(obj) -> bool:
    return type(obj).__name__ == "FixtureFunctionDefinition" or hasattr(obj, "_pytestfixturefunction")


def test_no_test_module_imports_another_and_fixtures_come_from_pytest():
    wrong = []
    for tier in TIERS:
        for path in sorted((TESTS / tier).rglob("*.py")):
            for module, names in _imports(path):
                if module.split(".")[:2] in ([["tests", t] for t in TIERS]) or (module == "tests" and set(names) & set(TIERS)):
                    wrong.append(f"{path.relative_to(REPO)} imports {module} {names or ''}: a test module")
                elif module.startswith("tests.fixtures."):
                    fixtures = [n for n in names if _is_fixture(getattr(importlib.import_module(module), n, None))]
                    if fixtures:
                        wrong.append(f"{path.relative_to(REPO)} imports the fixtures {fixtures} from {module}")
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("plugin", [p for p in pytest_plugins if p.startswith("tests.")])
def test_every_fixture_module_is_a_plugin_of_the_suite(plugin):
    """The modules named in ``pytest_plugins`` exist and hold fixtures: what a test module would otherwise import."""
    module = importlib.import_module(plugin)
    assert any(_is_fixture(v) for v in vars(module).values()), f"{plugin} defines no fixture"
