"""The documentation holds up: its links lead somewhere, and its code blocks are code.

For README.md, every page under docs/, scenarios/README.md and results/reference/NOTES.md:

- every relative link ``[text](path)`` or ``[text](path#anchor)`` names a file or folder that
  exists, and an ``#anchor`` into a Markdown file names one of its headings (GitHub's slugs);
- every ``toml`` block parses, and one that is a whole scenario (it has a ``[workload]`` table)
  loads with the scenario loader;
- every ``python`` block compiles;
- every ``cutbench SUBCOMMAND`` in a ``sh``/``bash``/``console`` block names a command of the CLI
  (and a command of a group, for ``cutbench criu install``).

All in process: the files are read and the CLI's click group is inspected, nothing is run.
"""

from __future__ import annotations

import re
import shlex
import sys
import tomllib
import unicodedata
from collections import Counter
from pathlib import Path

import click
import pytest

from cutbench.harness.integrations.cli import cli
from cutbench.harness.model.scenario import parse_scenario

REPO = Path(__file__).resolve().parents[2]
PAGES = sorted({REPO / "README.md", *(REPO / "docs").glob("*.md"), REPO / "scenarios" / "README.md",
                REPO / "results" / "reference" / "NOTES.md"})
SHELLS = {"sh", "bash", "console", "shell"}

FENCE = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|~{3,})(?P<info>[^\n`]*)\n(?P<body>.*?)^(?P=indent)(?P=fence)[ \t]*$",
                   re.M | re.S)
LINK = re.compile(r"!?\[(?P<text>(?:[^\[\]]|\[[^\]]*\])*)\]\((?P<target><[^>]*>|[^)\s]+)(?:\s+\"[^\"]*\")?\)")
INLINE_CODE = re.compile(r"(`+)(?:.+?)\1", re.S)
HEADING = re.compile(r"^ {0,3}(#{1,6})[ \t]+(?P<text>.+?)[ \t#]*$", re.M)


def _rel(path: Path) -> str:
    return str(path.relative_to(REPO))


def blocks(path: Path) -> list[tuple[str, str, int]]:
    """(language, body, line) of every fenced code block."""
    text = path.read_text()
    return [(m["info"].strip().split()[0].lower() if m["info"].strip() else "", m["body"], text.count("\n", 0, m.start()) + 1)
            for m in FENCE.finditer(text)]


def prose(path: Path) -> str:
    """The page without its code blocks and inline code spans (links in code are not links)."""
    text = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), path.read_text())
    return INLINE_CODE.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: the rendered text, lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link renders as its text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "").replace("*", "")
    text = re.sub(r"(?<!\w)_+|_+(?!\w)", "", text)  # _emphasis_, not snake_case
    out = []
    for ch in text.strip().lower():
        if ch in " -_" or unicodedata.category(ch)[0] in "LN":
            out.append("-" if ch == " " else ch)
    return "".join(out)


def anchors(path: Path) -> set[str]:
    """Every heading anchor of a Markdown page, duplicates numbered as GitHub numbers them."""
    seen: Counter[str] = Counter()
    out = set()
    for m in HEADING.finditer(FENCE.sub("", path.read_text())):
        base = slug(m["text"])
        out.add(base if not seen[base] else f"{base}-{seen[base]}")
        seen[base] += 1
    return out


def test_slugs_are_githubs():
    assert slug("Containers: the `docker` and `podman` backends") == "containers-the-docker-and-podman-backends"
    assert slug("CRIU's CUDA plugin build") == "crius-cuda-plugin-build"
    assert slug("`md_simulation` through CRIU") == "md_simulation-through-criu"
    assert slug("Effect fences (output commit)") == "effect-fences-output-commit"
    assert slug("Overrides, sweeps, variants") == "overrides-sweeps-variants"


def test_the_pages_are_there():
    names = {_rel(p) for p in PAGES}
    assert {"README.md", "docs/DESIGN.md", "scenarios/README.md", "results/reference/NOTES.md"} <= names
    assert len(names) > 10, names


def test_the_design_page_stays_a_map():
    """docs/DESIGN.md: the rooms, the import rule, the life of a trial and where to look; detail lives on the
    topic pages it links."""
    assert len((REPO / "docs" / "DESIGN.md").read_text().splitlines()) <= 250


def test_the_readme_stays_a_five_minute_read_that_indexes_every_page():
    readme = REPO / "README.md"
    text = readme.read_text()
    assert len(text.splitlines()) <= 250, "README.md is the five-minute read; reference material goes to docs/"
    headings = [line for line in text.splitlines() if line.startswith("## ")]
    assert len(headings) <= 14, headings
    for page in sorted((REPO / "docs").glob("*.md")):
        assert f"docs/{page.name}" in text, f"README's index does not name docs/{page.name}"


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_relative_links_resolve(page: Path):
    broken = []
    for m in LINK.finditer(prose(page)):
        target = m["target"].strip("<>")
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        line = prose(page).count("\n", 0, m.start()) + 1
        if not dest.exists():
            broken.append(f"line {line}: {target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"line {line}: {target} (no heading #{anchor} in {_rel(dest)})")
    assert not broken, f"{_rel(page)}:\n" + "\n".join(broken)


def _workload_from_the_page(page: Path, name: str, tmp_path: Path, monkeypatch) -> None:
    """A scenario naming a workload by import path ``module:Class`` whose class the same page shows: the
    page's block saved as ``module.py`` on ``sys.path``, as the page tells its reader to do."""
    module, _, cls = name.partition(":")
    shown = [body for lang, body, _ in blocks(page) if lang in ("python", "py") and f"class {cls}" in body]
    if module.isidentifier() and shown:
        (tmp_path / f"{module}.py").write_text(shown[0])
        monkeypatch.syspath_prepend(str(tmp_path))
        monkeypatch.setitem(sys.modules, module, None)  # restored (removed) after the test ...
        del sys.modules[module]                         # ... and imported from tmp_path during it


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_toml_blocks_parse_and_scenarios_load(page: Path, tmp_path: Path, monkeypatch):
    for lang, body, line in blocks(page):
        if lang != "toml":
            continue
        where = f"{_rel(page)}, block at line {line}"
        try:
            data = tomllib.loads(body)
        except tomllib.TOMLDecodeError as exc:
            pytest.fail(f"{where}: not TOML: {exc}")
        if isinstance(data.get("workload"), dict):
            name = data["workload"].get("name", "")
            if isinstance(name, str) and ":" in name:
                _workload_from_the_page(page, name, tmp_path, monkeypatch)
            try:
                parse_scenario(data, source_path=str(page.parent / "scenario.toml"))
            except Exception as exc:  # noqa: BLE001 - any failure is a doc that lies
                pytest.fail(f"{where}: the scenario does not load: {type(exc).__name__}: {exc}")


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_python_blocks_compile(page: Path):
    for lang, body, line in blocks(page):
        if lang in ("python", "py"):
            compile(body, f"{_rel(page)}:{line}", "exec")


# `cutbench WORD` where a command starts (line start, after ; && || | or `$(`), also as
# `sudo …`, `VAR=value …`, `python -m cutbench` or a path ending in `/cutbench`.
COMMAND = re.compile(r"(?:^\s*|[;&|(]\s*)(?:sudo\s+)?(?:\w+=\S*\s+)*(?:python3?\s+-m\s+|\S*/)?cutbench\s+(?P<rest>[^;&|#\n]*)",
                     re.M)


def command_lines(lang: str, body: str) -> list[str]:
    """The command lines of a shell block: a console block's are those after a prompt."""
    lines = []
    for raw in body.splitlines():
        if lang == "console":
            if not raw.lstrip().startswith(("$ ", "# ")):
                continue
            raw = raw.lstrip()[2:]
        lines.append(re.sub(r"(^|\s)#\s.*$", "", raw))  # a trailing comment
    return lines


def invocations(lang: str, body: str) -> list[list[str]]:
    """The words after `cutbench` in every invocation in a shell block."""
    out = []
    for line in command_lines(lang, body):
        for m in COMMAND.finditer(line):
            rest = m["rest"]
            try:
                words = shlex.split(rest)
            except ValueError:
                words = rest.split()
            out.append(words)
    return out


def unknown_command(words: list[str]) -> str | None:
    """Why ``cutbench WORDS`` names no command of the CLI, or None when it does."""
    group: click.Group = cli
    path = ["cutbench"]
    for word in words:
        if word.startswith("-") or not isinstance(group, click.Group):
            return None
        name = word.split("|")[0]  # `engine start|stop` in a synopsis
        cmd = group.commands.get(name)
        if cmd is None:
            return f"`{' '.join(path)} {word}`: no such command (known: {', '.join(sorted(group.commands))})"
        path.append(name)
        if not isinstance(cmd, click.Group):
            return None
        group = cmd
    return None


def test_the_command_finder_sees_what_a_reader_would_type():
    assert invocations("sh", "cutbench run x.toml  # a comment\n") == [["run", "x.toml"]]
    assert invocations("sh", "a && .venv/bin/cutbench doctor\npython -m cutbench list backends\n") == [["doctor"], ["list", "backends"]]
    assert invocations("sh", "pip install 'cutbench[pg]'\n") == []
    assert invocations("console", "$ cutbench doctor\ncutbench 0.1.0\n") == [["doctor"]]
    assert invocations("sh", "sudo X=1 cutbench engine start docker; cutbench engine status\n") == [
        ["engine", "start", "docker"], ["engine", "status"]]
    assert unknown_command(["criu", "install", "--from", "DIR"]) is None
    assert unknown_command(["engine", "start|stop", "docker"]) is None
    assert "no such command" in unknown_command(["frobnicate"])
    assert "no such command" in unknown_command(["criu", "uninstall"])


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_shell_blocks_name_real_subcommands(page: Path):
    wrong = []
    for lang, body, line in blocks(page):
        if lang not in SHELLS:
            continue
        for words in invocations(lang, body):
            why = unknown_command(words)
            if why:
                wrong.append(f"block at line {line}: {why}")
    assert not wrong, f"{_rel(page)}:\n" + "\n".join(wrong)


def test_every_public_docstring_opens_with_a_plain_sentence():
    """A public function's or class's docstring starts as a sentence a newcomer reads ("Return ``value`` if…",
    "The workload ``probe_x``: …"), not with a code fragment or a lower-case phrase; the command group's help, which
    opens with the command's name, is the one exception."""
    import ast

    from tests.conftest import REPO

    exempt = {("harness/integrations/cli.py", "cli")}
    fragments = []
    for folder in ("harness", "cutbench", "receivers", "workloads"):
        for path in sorted((REPO / folder).rglob("*.py")):
            rel = str(path.relative_to(REPO))
            for node in ast.walk(ast.parse(path.read_text())):
                if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) or node.name.startswith("_"):
                    continue
                doc = (ast.get_docstring(node) or "").strip()
                if doc and not re.match(r"[A-Z0-9]", doc) and (rel, node.name) not in exempt:
                    fragments.append(f"{rel}:{node.lineno} {node.name}: {doc.splitlines()[0][:60]}")
    assert fragments == []
