"""cutbench: a fault-injection correctness benchmark for GPU checkpoint/restore.

One import name for the whole project. The repository keeps its three
top-level folders, and each module in them has one name, under this package,
so that an installed cutbench puts exactly one name into ``site-packages``:

- ``cutbench.harness``: the benchmark (its rooms follow Jepsen's roles; see
  ``harness/__init__.py``);
- ``cutbench.workloads``: deterministic programs with ground truth, run as
  the checkpointed process;
- ``cutbench.receivers``: the durable external service that records effects.

The wheel puts the three folders inside ``cutbench/`` (``package-dir`` in
``pyproject.toml``). A checkout keeps them beside it, and this module appends
the repository root to the package's ``__path__``, so that a checkout that is
only on ``PYTHONPATH`` (the GPU machine, ``python -m cutbench`` from the root)
resolves ``cutbench.harness`` to ``<root>/harness`` as the editable install
does. Their bare names (``import harness``) raise ``ImportError``: a module
loaded under two names would hold two copies of every class.

For code, ``cutbench.open_run(path)`` opens a stored run (see
``cutbench.api``, the package's front door, loaded on first use).

The modules beside this file are the ground floor every room may import and
that imports none of them: ``errors`` (the error types and exit codes),
``procs`` (process trees), ``interrupts`` (Ctrl-C held out of cleanups),
``files`` (atomic writes), ``storage`` (a full disk told apart),
``validate`` (argument checks) and ``registry`` (plug-ins by entry point).
"""

__version__ = "0.1.0"

import os
from pathlib import Path

# The folder that holds the package: the repository root in a checkout
# (editable install or not), site-packages in an installed copy.
IMPORT_ROOT = Path(__file__).resolve().parent.parent


def source_checkout() -> Path | None:
    """The repository root when cutbench runs from a source checkout, else None."""
    return IMPORT_ROOT if (IMPORT_ROOT / "pyproject.toml").is_file() and (IMPORT_ROOT / "harness").is_dir() else None


def tool_prefix(name: str, env: str) -> Path:
    """Where the project keeps a tool it carries (``criu``, ``slurm``): ``$ENV`` if set, else ``<checkout>/.NAME``
    in a source checkout, else ``$XDG_DATA_HOME/cutbench/NAME`` (``~/.local/share/cutbench/NAME``)."""
    if os.environ.get(env):
        return Path(os.environ[env]).expanduser()
    repo = source_checkout()
    if repo is not None:
        return repo / f".{name}"
    return Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share") / "cutbench" / name


# A checkout: harness/, workloads/ and receivers/ sit beside this folder, not in it. Searched after it, the
# root gives them their one name (cutbench.harness is <root>/harness), as pyproject.toml's package-dir gives
# it in the wheel and the editable install; their own __init__ refuses any other name.
if source_checkout() is not None:
    __path__.append(str(IMPORT_ROOT))


def __getattr__(name: str):
    """``cutbench.run``, ``cutbench.open_run`` and ``cutbench.Run``: the front door (:mod:`cutbench.api`), imported
    on first use so that ``import cutbench`` loads none of the rooms (PEP 562)."""
    if name in ("run", "open_run", "Run"):
        from cutbench import api

        return getattr(api, name)
    raise AttributeError(f"module 'cutbench' has no attribute {name!r}")
