"""Suite-wide test policy.

- Tests live by tier: ``tests/unit`` (in this process: no CRIU, no GPU, no
  receiver or other service process), ``tests/service`` (real receiver
  processes, PostgreSQL, pytest and the ``cutbench`` command in subprocesses,
  ``pip``, the committed reference runs re-judged), ``tests/criu`` (real CRIU dumps and restores), ``tests/gpu`` (an
  NVIDIA GPU), with shared fixtures and helpers in ``tests/fixtures``. The fixtures come from the
  modules named in ``pytest_plugins`` below; plain helpers and constants are
  imported from ``tests/fixtures``; a test module never imports another test
  module. The tier folder adds its marker to every test in it, so ``-m criu``
  and ``-m gpu`` select the same tests as the folders.
- ``gpu`` tests skip, with the reason, where no usable GPU and driver
  checkpoint API exist (CI has none).
- ``criu`` tests never skip: the ``criu`` fixture raises when CRIU cannot be
  used, so a CI machine without CRIU fails loudly instead of reporting green.
- Under pytest-xdist (``make test`` runs ``-n 2 --dist loadgroup``) each worker
  has its own claims directory (``CUTBENCH_RUNS_DIR``) and sees only its own
  processes (:func:`live_processes`); one dockerd serves the session
  (``tests/fixtures/container_fixtures.py``); the tests of an ``xdist_group``
  run on one worker (the Ray tests, a module's tests that share a
  module-scoped fixture), and a test marked ``alone`` runs while no other test
  runs. The criu tier's work is handed out first, the unit tier's last.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# ``CUTBENCH_FULL_SUITE=1``: the full example counts where a test runs fewer by default (docs/development.md).
FULL_SUITE = os.environ.get("CUTBENCH_FULL_SUITE") == "1"
# The xdist worker this process is ("gw0", ...), or "main" without xdist.
WORKER = os.environ.get("PYTEST_XDIST_WORKER", "main")
# Set in this test process's environment, and so in that of every process it starts (workloads, receivers, CRIU's
# restored tasks, Ray's): what tells this worker's processes from another worker's (:func:`live_processes`).
WORKER_ENV = "CUTBENCH_TEST_WORKER"
# A directory the xdist controller makes for the session and its workers share: the locks of ``alone``.
LOCKS_ENV = "CUTBENCH_TEST_LOCKS"

# The shared fixtures reach every tier through pytest itself, never through an
# import into a test module: an imported fixture is registered again in each
# module that imports it, so a session fixture (a CRIU run, a PostgreSQL
# cluster, a dockerd) would be made once per module. `pytester`: the plugin
# tests (service and criu tiers) drive pytest itself.
pytest_plugins = [
    "pytester",
    "tests.fixtures.container_fixtures",
    "tests.fixtures.doc_examples",
    "tests.fixtures.receiver_fixtures",
    "tests.fixtures.run_fixtures",
    "tests.fixtures.workload_cases",
]


@functools.lru_cache(maxsize=1)
def gpu_skip_reason() -> str | None:
    """Why GPU tests cannot run here, or None when they can."""
    try:
        from cutbench.harness.environment import gpu_probe

        facts = gpu_probe.probe()
    except Exception as exc:  # a probe failure is a reason to skip, shown to the user
        return f"GPU probe failed: {exc}"
    if facts.get("usable"):
        return None
    return "no usable NVIDIA GPU with CuPy and the CUDA driver checkpoint API here"


TIERS = {"service": pytest.mark.service, "criu": pytest.mark.criu, "gpu": pytest.mark.gpu}


def pytest_configure(config: pytest.Config) -> None:
    os.environ[WORKER_ENV] = f"{WORKER}:{os.getpid()}"
    if WORKER == "main" and not os.environ.get(LOCKS_ENV):  # the controller (or a run without xdist): workers inherit it
        os.environ[LOCKS_ENV] = tempfile.mkdtemp(prefix="cutbench-test-locks-")
        config.stash[_LOCKS_MADE] = os.environ[LOCKS_ENV]
    if WORKER != "main":
        # A run's claim (harness/environment/leftovers.py) is swept by the next run whose claims directory holds it:
        # one directory per worker, so that one worker's runs never sweep what another's killed harness left for
        # its own test to see removed. Kept across sessions, so that a later session's runs still sweep it.
        runs = Path(os.environ.get("CUTBENCH_RUNS_DIR", "/var/tmp/cutbench/runs"))
        os.environ["CUTBENCH_RUNS_DIR"] = str(runs.with_name(f"{runs.name}-test-{WORKER}"))


_LOCKS_MADE = pytest.StashKey[str]()


def pytest_unconfigure(config: pytest.Config) -> None:
    made = config.stash.get(_LOCKS_MADE, None)
    if made:
        shutil.rmtree(made, ignore_errors=True)
        os.environ.pop(LOCKS_ENV, None)


@contextlib.contextmanager
def _room(alone: bool) -> Iterator[None]:
    """Under xdist, a shared lock for every test and an exclusive one for an ``alone`` test.

    A ``turnstile`` taken on the way in keeps a waiting ``alone`` test from being starved: while it waits for
    the tests in the room to leave, no new one enters.
    """
    locks = os.environ.get(LOCKS_ENV)
    if WORKER == "main" or not locks or not os.path.isdir(locks):
        yield
        return
    with open(os.path.join(locks, "turnstile"), "a") as turnstile, open(os.path.join(locks, "room"), "a") as room:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        try:
            fcntl.flock(room, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        finally:
            if not alone:
                fcntl.flock(turnstile, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(room, fcntl.LOCK_UN)
            if alone:
                fcntl.flock(turnstile, fcntl.LOCK_UN)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    """Setup, call and teardown of ``item`` inside the room (:func:`_room`)."""
    with _room(item.get_closest_marker("alone") is not None):
        return (yield)


# xdist's own loadgroup passes a test's group to its scheduler by appending it to the test's node id, which pytest
# 9.2 no longer lets it change (pytest-xdist issue 1386): the groups go to the controller in a file of each worker
# instead, and ``--dist loadgroup`` is this scheduler: one work unit per group, every other test a unit of its own.
def _group_files() -> list[Path]:
    locks = os.environ.get(LOCKS_ENV)
    return sorted(Path(locks).glob("groups-*.json")) if locks and os.path.isdir(locks) else []


@pytest.hookimpl(tryfirst=True)  # before the worker reports its collection to the controller
def pytest_collection_finish(session: pytest.Session) -> None:
    locks = os.environ.get(LOCKS_ENV)
    if WORKER == "main" or not locks or not os.path.isdir(locks):
        return
    groups = {}
    for item in session.items:
        names = {str(m.args[0] if m.args else m.kwargs.get("name", "default")) for m in item.iter_markers("xdist_group")}
        if names:
            groups[item.nodeid] = "_".join(sorted(names))
    path = Path(locks) / f"groups-{WORKER}.json"
    path.with_suffix(".tmp").write_text(json.dumps(groups))
    path.with_suffix(".tmp").rename(path)


@pytest.hookimpl(optionalhook=True)  # an xdist hook: absent without pytest-xdist
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        """Load scheduling with the tests of one ``xdist_group`` as one work unit. The longest work first, so that
        it does not start last: the criu tier's units (groups before single tests), then the service tier's, then
        the unit tier's short tests, which fill the end."""

        groups: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self.groups is None:  # every worker wrote its file before it reported its collection
                self.groups = {}
                for path in _group_files():
                    self.groups.update(json.loads(path.read_text()))
            return self.groups.get(nodeid, nodeid)

        def schedule(self) -> None:
            """LoadScopeScheduling's, with the work units queued in this order."""
            if self.collection is not None or not self.collection_is_completed:
                return super().schedule()
            if not self._check_nodes_have_same_collection():
                self.log("**Different tests collected, aborting run**")
                return None
            self.collection = list(next(iter(self.registered_collections.values())))
            units: dict[str, dict[str, bool]] = {}
            for nodeid in self.collection:
                units.setdefault(self._split_scope(nodeid), {})[nodeid] = False
            rank = {"criu": 0, "service": 1, "unit": 2}
            for unit in sorted(units, key=lambda u: (min(rank.get(n.split("/")[1], 3) for n in units[u]), -len(units[u]))):
                self.workqueue[unit] = units[unit]
            for _ in range(max(0, len(self.nodes) - len(self.workqueue))):  # more workers than work
                self.assigned_work.popitem()[0].shutdown()
            for node in self.nodes:
                self._assign_work_unit(node)
            for node in self.nodes:
                self._reschedule(node)
            if not self.workqueue:
                for node in self.nodes:
                    node.shutdown()
            return None

    return GroupScheduling(config, log)


def _uses_a_module_fixture(item: pytest.Item) -> bool:
    """True when ``item`` uses a module-scoped fixture: under xdist its module's tests then run on one worker."""
    info = getattr(item, "_fixtureinfo", None)
    defs = getattr(info, "name2fixturedefs", {}) if info is not None else {}
    return any(d[-1].scope == "module" for d in defs.values() if d)


@pytest.hookimpl(tryfirst=True)  # before xdist reads the xdist_group marks (its worker's hook)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = None
    for item in items:
        tier = Path(str(item.fspath)).parent.name
        if tier in TIERS and item.get_closest_marker(tier) is None:
            item.add_marker(TIERS[tier])
        if item.get_closest_marker("xdist_group") is None and _uses_a_module_fixture(item):
            # Its module's tests on one worker: the fixture made once, the tests in order (one may build on another).
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))
        if item.get_closest_marker("gpu") is not None:
            reason = reason or gpu_skip_reason()
            if reason:
                item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="session")
def criu():
    """The CRIU install the tests use; raises (fails the test) when CRIU is unusable."""
    from cutbench.harness.provision.criu import locate

    return locate.require_criu()


@pytest.fixture
def gromacs() -> None:
    """GROMACS's ``gmx`` on PATH; fails where the suite requires it (CI, ``CUTBENCH_REQUIRE_GROMACS=1``), else skips."""
    if shutil.which("gmx") is None:
        reason = "GROMACS (gmx) is not installed: `make gromacs` installs Debian's package"
        if os.environ.get("CI") or os.environ.get("CUTBENCH_REQUIRE_GROMACS") == "1":
            pytest.fail(f"{reason} (required here because CI or CUTBENCH_REQUIRE_GROMACS=1 is set)")
        pytest.skip(reason)


@pytest.fixture
def results_root(tmp_path: Path) -> Path:
    """A fresh results root for one test."""
    root = tmp_path / "results"
    root.mkdir()
    return root


def _of_this_worker(proc: Path) -> bool:
    """True when the process carries this test process's :data:`WORKER_ENV` (it was started from here)."""
    if WORKER_ENV not in os.environ:  # outside a pytest session: every process
        return True
    mark = f"{WORKER_ENV}={os.environ[WORKER_ENV]}".encode()
    try:
        return mark in (proc / "environ").read_bytes().split(b"\0")
    except OSError:
        return False


def live_processes() -> list[tuple[int, str]]:
    """Every live (non-zombie) process but this one that this test process (this xdist worker) started, directly or
    not, with its command line."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and _of_this_worker(proc):
            found.append((int(proc.name), cmd.strip()))
    return found


def workload_processes() -> list[tuple[int, str]]:
    """Live (non-zombie) processes that are cutbench workloads (their ranks, their loader workers) or receivers started
    by tests."""
    marks = ("cutbench.workloads.launch", "cutbench.workloads.ranks", "cutbench.workloads.data_loader", "cutbench.receivers serve")
    return [(pid, cmd) for pid, cmd in live_processes() if any(m in cmd for m in marks)]
