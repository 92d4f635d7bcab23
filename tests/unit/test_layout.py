"""The floor plan, enforced: which package may import which (docs/DESIGN.md, "Layout and import rule").

Every ``import`` statement counts, function-local ones included: a lazy
import is still a dependency. The rule, lowest first:

    ground floor (cutbench.errors, procs, files, validate, registry, interrupts, storage)
      → receivers (ground floor only)
      → workloads (ground floor and cutbench.receivers.client only)
      → harness rooms: model → checker → generator → store → provision
        → environment → nemesis → observer → reports → runner → integrations

A room may import the ground floor, workloads, receivers, itself and the rooms
before it. The doors rank with what they open: ``cutbench.__main__`` (the
shell's) and ``cutbench.api`` (runs, for code) with integrations,
``cutbench.backend`` (a tool's author's) with nemesis, ``cutbench.workload`` (a
workload's author's) with workloads; the package's ``__init__`` reaches
``cutbench.api`` only lazily, from its module ``__getattr__`` (the one upward
import the ground floor makes, and not an edge of the import graph: it runs
after the package is loaded). No module may import the bare names ``harness``, ``workloads`` or
``receivers``, and the module graph has no cycles.

One name per module: the three folders are ``cutbench.harness``, ``cutbench.workloads`` and
``cutbench.receivers`` (``package-dir`` in the wheel, ``cutbench.__path__`` in a checkout) and refuse
their bare names. Each door's public names are what it imports, each written once.
"""

from __future__ import annotations

import ast
import importlib
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest


from tests.conftest import REPO

ROOMS = ("model", "checker", "generator", "store", "provision", "environment", "nemesis", "observer", "reports", "runner",
         "integrations")
PACKAGES = ("harness", "workloads", "receivers")
# Features kept together (harness/<feature>/): each module is named after the room it ranks with.
FEATURES = ("hunt", "matrix")


def module_name(root: Path, path: Path) -> str:
    """``cutbench.harness.model.plan`` for ``<root>/harness/model/plan.py`` (and the ground floor under ``cutbench/``)."""
    rel = path.relative_to(root).with_suffix("")
    parts = list(rel.parts)
    if parts[0] == "cutbench":
        parts = parts[1:]
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(["cutbench", *parts])


def imports_of(path: Path, name: str) -> list[tuple[int, str]]:
    """Every module ``path`` imports (absolute names; relative ones resolved against ``name``)."""
    is_pkg = path.name == "__init__.py"
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = name.split(".") if is_pkg else name.split(".")[:-1]
                pkg = pkg[: len(pkg) - (node.level - 1)]
                base = ".".join(pkg + ([base] if base else []))
            out.append((node.lineno, base))
            out += [(node.lineno, f"{base}.{a.name}") for a in node.names]
    return out


def rank(module: str) -> tuple[str, int] | None:
    """The layer of a cutbench module as (label, order), or None for a name outside cutbench."""
    parts = module.split(".")
    if parts[0] in PACKAGES:
        return ("bare " + parts[0], -1)
    if parts[0] != "cutbench":
        return None
    if module in DOORS:
        room = DOORS[module]
        return ("workloads", 2) if room == "workloads" else (room, 4 + ROOMS.index(room))
    if len(parts) == 1 or parts[1] not in PACKAGES:
        return ("ground", 0)
    if parts[1] == "receivers":
        return ("receivers", 1)
    if parts[1] == "workloads":
        return ("workloads", 2)
    if len(parts) > 3 and parts[2] in FEATURES and parts[3] in ROOMS:
        return (parts[3], 4 + ROOMS.index(parts[3]))  # a feature's module ranks with the room it is named after
    if len(parts) < 3 or parts[2] not in ROOMS:
        return ("harness", 3)  # the harness package or a feature's (each __init__ holds only a docstring)
    return (parts[2], 4 + ROOMS.index(parts[2]))


# The public doors and the room each ranks with: `python -m cutbench`, runs (`cutbench.open_run`), a tool's author's
# and a workload's author's.
DOORS = {"cutbench.__main__": "integrations", "cutbench.api": "integrations", "cutbench.backend": "nemesis",
         "cutbench.workload": "workloads"}


# Imports made on first attribute access, after the importing module is loaded (PEP 562): allowed, and no cycle.
LAZY_DOORS = {("cutbench", "cutbench.api")}


def allowed(src: str, dst: str) -> bool:
    """Whether module ``src`` may import module ``dst`` (both cutbench modules)."""
    if (src, dst) in LAZY_DOORS:
        return True
    (s_label, s), (d_label, d) = rank(src), rank(dst)
    if d < 0:
        return False
    if s_label == d_label:
        return True
    if s_label == "workloads":
        return d == 0 or dst == "cutbench.receivers.client" or dst.startswith("cutbench.receivers.client.")
    if s_label == "receivers":
        return d == 0
    if s == 0:
        return False
    if s >= 3 and d in (1, 2):  # the harness uses workloads and the receiver
        return True
    return d < s


def sources(root: Path) -> list[Path]:
    """The Python files of the package: the ground floor under cutbench/ and the three rooms' folders."""
    files = [p for p in (root / "cutbench").glob("*.py")]
    for pkg in PACKAGES:
        files += sorted((root / pkg).rglob("*.py"))
    return files


def layout_violations(root: Path) -> list[str]:
    """Every import that breaks the rule, and every import cycle, in the tree at ``root``; empty when clean."""
    problems: list[str] = []
    modules: dict[str, Path] = {module_name(root, p): p for p in sources(root)}
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        for line, imported in imports_of(path, name):
            if rank(imported) is None:
                continue
            if not allowed(name, imported):
                problems.append(f"{path.relative_to(root)}:{line}: {name} ({rank(name)[0]}) imports {imported} ({rank(imported)[0]})")
            target = imported if imported in modules else imported.rpartition(".")[0]
            if target in modules and target != name and (name, target) not in LAZY_DOORS:
                graph[name].add(target)
    # Cycles: depth-first search over the module graph.
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                problems.append("import cycle: " + " -> ".join(stack[stack.index(n):] + [n]))
            elif n not in state:
                visit(n)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)
    return problems


def test_the_tree_follows_the_import_rule():
    assert layout_violations(REPO) == []


def copy_tree(tmp_path: Path) -> Path:
    root = tmp_path / "tree"
    for part in ("cutbench", *PACKAGES):
        src = REPO / part
        if part == "cutbench":
            (root / part).mkdir(parents=True)
            for f in src.glob("*.py"):
                shutil.copy(f, root / part / f.name)
        else:
            shutil.copytree(src, root / part, ignore=shutil.ignore_patterns("__pycache__"))
    return root


def test_an_upward_import_is_reported(tmp_path):
    root = copy_tree(tmp_path)
    assert layout_violations(root) == []
    plan = root / "harness" / "model" / "plan.py"
    plan.write_text(plan.read_text() + "\n\ndef _late():\n    from cutbench.harness.runner import run  # noqa\n")
    found = layout_violations(root)
    assert any("cutbench.harness.model.plan (model) imports cutbench.harness.runner" in p for p in found), found
    assert any(p.startswith("import cycle:") for p in found), found


def test_a_feature_s_folder_holds_only_modules_named_after_rooms():
    """harness/ holds the rooms and the features; a feature's module is named after the room it ranks with, so its
    place in the import order is its name (``hunt/model.py`` ranks with the model)."""
    folders = {p.parent.name for p in (REPO / "harness").glob("*/__init__.py")}
    assert folders == set(ROOMS) | set(FEATURES)
    strays = [f"{feature}/{p.name}" for feature in FEATURES for p in (REPO / "harness" / feature).glob("*.py")
              if p.stem != "__init__" and p.stem not in ROOMS]
    assert strays == []
    assert not any(imports_of(REPO / "harness" / f / "__init__.py", f"cutbench.harness.{f}") for f in FEATURES)


def test_an_upward_import_inside_a_feature_is_reported(tmp_path):
    root = copy_tree(tmp_path)
    model = root / "harness" / "hunt" / "model.py"
    model.write_text(model.read_text() + "\n\ndef _late():\n    from cutbench.harness.hunt import runner  # noqa\n")
    found = layout_violations(root)
    assert any("cutbench.harness.hunt.model (model) imports cutbench.harness.hunt.runner (runner)" in p for p in found), found


def test_receivers_and_workloads_stay_on_their_floors(tmp_path):
    root = copy_tree(tmp_path)
    (root / "receivers" / "server.py").write_text((root / "receivers" / "server.py").read_text() + "\nfrom cutbench.harness.model import plan\n")
    (root / "workloads" / "counter.py").write_text((root / "workloads" / "counter.py").read_text() + "\nfrom cutbench.receivers import server\n")
    (root / "cutbench" / "procs.py").write_text((root / "cutbench" / "procs.py").read_text() + "\nimport harness\n")
    found = "\n".join(layout_violations(root))
    assert "cutbench.receivers.server (receivers) imports cutbench.harness.model" in found
    assert "cutbench.workloads.counter (workloads) imports cutbench.receivers.server" in found
    assert "cutbench.procs (ground) imports harness (bare harness)" in found


def test_the_checkpointed_process_loads_no_server_side_code():
    """A workload process imports the receiver client only: not the asyncio server, the stores, sqlite3 or pandas."""
    code = ("import sys, cutbench.workloads.launch, cutbench.receivers.client\n"
            "heavy = ('asyncio', 'sqlite3', 'pandas', 'cutbench.receivers.server', 'cutbench.receivers.stores', 'cutbench.harness')\n"
            "print(','.join(m for m in heavy if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "", f"loaded in the workload process: {proc.stdout.strip()}"


def test_the_wheel_s_package_list_is_the_tree():
    """pyproject.toml lists every package (a folder with an ``__init__.py``) under its cutbench name, and maps the
    three folders into ``cutbench``: a new subpackage left off the list would be missing from the wheel."""
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert config["package-dir"] == {f"cutbench.{pkg}": pkg for pkg in PACKAGES}
    tree = ["cutbench"] + [module_name(REPO, init) for pkg in PACKAGES for init in (REPO / pkg).rglob("__init__.py")]
    assert sorted(config["packages"]) == sorted(tree)
    assert not any((REPO / "cutbench" / pkg).exists() for pkg in PACKAGES), "cutbench/ holds the ground floor only"


@pytest.mark.parametrize("pkg", PACKAGES)
def test_a_bare_name_is_refused(pkg):
    """``import harness`` with the repository root on sys.path: an ImportError that names the one name to use."""
    code = f"import sys; sys.path.insert(0, {str(REPO)!r}); import {pkg}"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd="/")
    assert proc.returncode == 1
    assert f"ImportError: '{pkg}' is cutbench's {pkg} folder under another name: import cutbench.{pkg} " in proc.stderr


def test_every_module_has_one_name():
    """A class reached through ``cutbench.*`` is itself, and nothing loaded in this process holds a file of the three
    folders under a name other than its cutbench one."""
    from cutbench.harness import nemesis
    from cutbench.harness.nemesis import base

    import cutbench.backend
    import cutbench.workload

    assert cutbench.backend.Capabilities is nemesis.Capabilities is base.Capabilities
    assert cutbench.backend.Child is importlib.import_module("cutbench.procs").Child
    assert cutbench.workload.BaseWorkload is importlib.import_module("cutbench.workloads.common").BaseWorkload
    # The folders beside the package in use (this checkout, or the one an editable install points at).
    assert Path(base.__file__) == cutbench.IMPORT_ROOT / "harness" / "nemesis" / "base.py"
    folders = tuple(str(cutbench.IMPORT_ROOT / pkg) + os.sep for pkg in PACKAGES)
    strays = [name for name, m in list(sys.modules.items())
              if (getattr(m, "__file__", None) or "").startswith(folders) and not name.startswith("cutbench.")]
    assert strays == []


def test_a_checkout_on_pythonpath_alone_finds_every_folder(tmp_path):
    """No install: a copy of the tree on PYTHONPATH (as the GPU machine runs it) loads its own folders under their
    cutbench names (an editable install's finder would have answered with this checkout's)."""
    root = copy_tree(tmp_path)
    shutil.copy(REPO / "pyproject.toml", root / "pyproject.toml")
    code = ("import cutbench, cutbench.harness.model.plan as p, cutbench.workloads.control as c, cutbench.receivers.protocol as r\n"
            "print(cutbench.source_checkout()); print(p.__file__); print(c.__file__); print(r.__file__)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd="/",
                          env={**os.environ, "PYTHONPATH": str(root)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [str(root), str(root / "harness" / "model" / "plan.py"), str(root / "workloads" / "control.py"),
                                   str(root / "receivers" / "protocol.py")]


def test_a_workload_importing_its_door_loads_neither_pandas_nor_the_harness():
    """``cutbench.workload`` runs inside the checkpointed process: it loads the workload runtime only."""
    code = ("import sys\n"
            "from cutbench.workload import BaseWorkload, PHASES, ReplayReference, Runtime, Ready, pointer, synchronize, to_host\n"
            "print(','.join(m for m in ('pandas', 'cutbench.harness', 'cutbench.api') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "", f"loaded by a workload's imports: {proc.stdout.strip()}"


@pytest.mark.parametrize("door", ["cutbench.api", "cutbench.backend", "cutbench.workload"])
def test_each_door_s_public_names_are_its_imports_and_at_most_25(door):
    """A door holds what its audience imports, each name written once (in its import), never more than 25."""
    module = importlib.import_module(door)
    tree = ast.parse(Path(module.__file__).read_text())
    imported = {a.asname or a.name: node.module for node in tree.body if isinstance(node, ast.ImportFrom)
                for a in node.names}
    assert all(isinstance(n, (ast.ImportFrom, ast.Expr)) for n in tree.body), "a door only imports"
    public = {n for n in vars(module) if not n.startswith("_") and not isinstance(getattr(module, n), type(ast))}
    assert public == set(imported) and len(imported) <= 25, sorted(public ^ set(imported))
    for name, home in imported.items():
        assert getattr(module, name) is getattr(importlib.import_module(home), name), name
    others = [importlib.import_module(d) for d in ("cutbench.api", "cutbench.backend", "cutbench.workload") if d != door]
    assert not set(imported) & {n for m in others for n in vars(m)}, "a name in two doors"


def test_every_error_cutbench_raises_is_a_cutbench_error_in_cutbench_errors():
    """An exception class defined anywhere in the package is private (``_Name``: control flow inside one module) or
    lives in :mod:`cutbench.errors` as a :class:`CutbenchError`. The hunt's kit is exempt: it imports nothing
    of cutbench, so that its reproducers run without it."""
    import cutbench.errors as errors

    strays = []
    for path in [p for pkg in PACKAGES for p in (REPO / pkg).rglob("*.py")] + list((REPO / "cutbench").glob("*.py")):
        if path.name in ("probe_kit.py", "lifecycle_kit.py") or path == REPO / "cutbench" / "errors.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_") and \
                    any(ast.unparse(b).split(".")[-1].endswith(("Error", "Exception", "Failed", "Unavailable", "Refused",
                                                                 "Fault", "NoAnswer", "Mismatch"))
                        for b in node.bases):
                strays.append(f"{path.relative_to(REPO)}: {node.name}")
    assert strays == []
    for name, value in vars(errors).items():
        if isinstance(value, type) and issubclass(value, BaseException):
            assert issubclass(value, errors.CutbenchError), name


def test_the_documented_coverage_table_is_the_backends_declared_coverage():
    """docs/backends.md's backend × domain table is derived from the registry, never typed in on its own."""
    from cutbench.harness.reports.summary import render_coverage

    assert render_coverage() in (REPO / "docs" / "backends.md").read_text()


def test_each_package_s_map_names_every_module_in_it():
    """A package's ``__init__`` docstring is its map: it names each module and sub-package in it as ``name``."""
    missing = []
    for init in sorted(p for pkg in PACKAGES for p in (REPO / pkg).rglob("__init__.py")):
        folder = init.parent
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        members = [p.stem for p in folder.glob("*.py") if p.stem != "__init__"]
        members += [p.parent.name for p in folder.glob("*/__init__.py")]
        missing += [f"{folder.relative_to(REPO)}/{m}" for m in sorted(members) if f"``{m}``" not in doc]
    assert missing == [], "not named in their package's __init__ docstring"


def test_the_harness_map_names_every_module_of_the_ground_floor():
    """harness/__init__'s list of the ground floor is the modules under cutbench/ that rank there (no door)."""
    doc = ast.get_docstring(ast.parse((REPO / "harness" / "__init__.py").read_text())) or ""
    ground = sorted(p.stem for p in (REPO / "cutbench").glob("*.py")
                    if p.stem != "__init__" and rank(f"cutbench.{p.stem}") == ("ground", 0))
    assert ground and [m for m in ground if f"``{m}``" not in doc and f"``cutbench.{m}``" not in doc] == []


def test_the_plug_in_tables_are_edges_that_land_on_what_they_list():
    """The two tables of built-ins name their plug-ins as ``"module:Class"`` strings (imported on first use, so a CPU
    machine never loads the GPU bindings), each next to what it lists: the backends' in
    ``harness/nemesis/backends/__init__.py`` (the ground floor's registry reads it by its address), the workloads' in
    ``workloads/api.py``. Each string lands on a class of that name in a module of the folder the table lists, and
    every backend class a module there defines (``class …Checkpointer``) is in the table: wiring no import shows,
    held here."""
    from cutbench.harness.nemesis.backends import BUILTIN as BACKENDS
    from cutbench.registry import CHECKPOINTERS
    from cutbench.workloads.api import BUILTIN

    def lands(target: str, folder: str) -> str | None:
        module, _, cls = target.partition(":")
        prefix = f"cutbench.{folder.replace('/', '.')}."
        if not module.startswith(prefix):
            return f"{target}: not a module of {folder}/"
        path = REPO / folder / (module[len(prefix):].replace(".", "/") + ".py")
        tree = ast.parse(path.read_text()) if path.exists() else None
        if tree is None or not any(isinstance(n, ast.ClassDef) and n.name == cls for n in tree.body):
            return f"{target}: no class {cls} in {path.relative_to(REPO)}"
        return None

    assert CHECKPOINTERS.builtin == BACKENDS  # the registry's built-ins are the table next to the backends
    wrong = [why for t in BACKENDS.values() if (why := lands(t, "harness/nemesis/backends"))]
    wrong += [why for t in BUILTIN.values() if (why := lands(t, "workloads"))]
    assert wrong == []
    listed = {t.partition(":")[2] for t in BACKENDS.values()}
    defined = {n.name for p in (REPO / "harness" / "nemesis" / "backends").glob("*.py")
               for n in ast.parse(p.read_text()).body
               if isinstance(n, ast.ClassDef) and n.name.endswith("Checkpointer") and not n.name.startswith("_")}
    assert defined - listed == set(), "backend classes no table lists"
