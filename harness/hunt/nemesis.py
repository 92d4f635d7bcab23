"""The hunt's hands: live sessions on a tool, reproducers written from the kit, and reproducers run on their own.

Everything a hunt does to a process goes through the kit
(:mod:`~cutbench.harness.nemesis.probe_kit` and
:mod:`~cutbench.harness.nemesis.lifecycle_kit`, files with no cutbench in them).
A reproducer is the kit's text, the sequence, the deviation it must show,
and a call to the kit's ``main``: the same code the hunt ran, so a reproducer
that does not show its deviation on its own points at the harness.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cutbench.errors import Unavailable
from cutbench.harness.provision import engines
from cutbench.harness.provision.criu import locate
from cutbench.harness.provision.criu.plugin import plugin_dir, plugin_unavailable_reason
from cutbench.harness.hunt.model import ENGINE_TOOLS, GPU_TOOLS, Step, check_tool
from cutbench.harness.nemesis import engine_kit, lifecycle_kit, probe_kit

# The kit's files in the order a reproducer joins them; an engine's tool appends the engine kit.
KIT = (Path(probe_kit.__file__), Path(lifecycle_kit.__file__))
ENGINE_KIT = Path(engine_kit.__file__)
KIT_IMPORT = "# kit-import"  # a kit file's import of an earlier one, dropped where the texts are joined


def unavailable_reason(tool: str) -> str | None:
    """Why ``tool``'s lifecycle cannot be driven on this machine, or None when it can."""
    check_tool(tool)
    if tool in ENGINE_TOOLS:
        from cutbench.harness.nemesis import Backends

        reason = Backends().unavailable_reason(tool)  # the engine answers and can checkpoint (with the fix)
        if reason:
            return f"{tool}: {reason}"
        if tool == "docker" and shutil.which("docker") is None:
            return "docker: the docker command is not on PATH (Debian's docker.io: `make containers`)"
    if tool in GPU_TOOLS:
        if shutil.which("nvidia-smi") is None:
            return f"{tool}: no NVIDIA GPU here (nvidia-smi is not on PATH)"
        if importlib.util.find_spec("cupy") is None:
            return f"{tool}: the probe needs CuPy (pip install cupy-cuda13x)"
    if tool in ("cuda", "criu-cuda-plugin") and importlib.util.find_spec("cuda") is None:
        return f"{tool}: the driver API needs cuda-bindings (pip install cuda-python)"
    if tool == "cuda-checkpoint" and shutil.which("cuda-checkpoint") is None:
        return "cuda-checkpoint: NVIDIA's utility is not on PATH"
    if tool == "criu-cuda-plugin":
        reason = plugin_unavailable_reason()
        if reason:
            return reason
    if locate.find_criu() is None:  # every tool's sequences take CRIU steps
        return f"{tool}: {locate.diagnose()}"
    return None


def environment(tool: str) -> dict[str, str]:
    """The variables a session (and a reproducer run here) reads: CRIU's command and the plugin's directory."""
    env = {"HUNT_CRIU": json.dumps(list(locate.require_criu().argv))}
    if tool in ENGINE_TOOLS:
        env["HUNT_ENGINE_PATH"] = engines.criu_path_env()["PATH"]
    if tool == "docker":
        env["DOCKER_HOST"] = engines.docker_host()
        env["HUNT_ENGINE_TMP"] = str(engines.docker_paths().tmp)
    if tool == "criu-cuda-plugin":
        d = plugin_dir()
        if d:
            env["HUNT_CRIU_LIBDIR"] = str(d)
    return env


def sessions(tool: str, bound_s: float) -> Callable[[str], lifecycle_kit.Session]:
    """A factory of fresh probes (of the variant it is given) under ``tool``; raises :class:`Unavailable` when the
    tool cannot run here."""
    reason = unavailable_reason(tool)
    if reason:
        raise Unavailable(reason)
    env = environment(tool)
    criu = json.loads(env["HUNT_CRIU"])
    session = lifecycle_kit.SESSIONS.get(tool, lifecycle_kit.Session)
    return lambda probe: session(tool, bound_s, criu, env.get("HUNT_CRIU_LIBDIR"), env, probe)


def needs(tool: str) -> str:
    """What a reproducer of ``tool`` needs on the machine it runs on, in words (its header's last lines)."""
    text = "CRIU: `criu` on PATH, or HUNT_CRIU='[\"/path/to/criu\"]'; the plugin's directory in HUNT_CRIU_LIBDIR."
    if tool == "docker":
        text += ("\nThe engine: `docker` on PATH answering at DOCKER_HOST (with experimental features: checkpoints); "
                 "HUNT_ENGINE_TMP: its temporary directory, where containerd unpacks checkpoints.")
    elif tool == "podman":
        text += "\nThe engine: `podman` on PATH, with runc."
    return text


def kit_body(path: Path, first: bool) -> str:
    """A kit file's text after its docstring, its imports of the kit files before it dropped (and, but for the
    first, its ``from __future__`` line, which must open a script)."""
    text = path.read_text().split('"""', 2)[2].lstrip("\n")
    return "\n".join(line for line in text.splitlines()
                     if not line.endswith(KIT_IMPORT) and (first or not line.startswith("from __future__"))) + "\n"


def reproducer(tool: str, sequence: list[Step], deviation: dict[str, Any], header: str, probe: str = "buffers") -> str:
    """A standalone script: the kit, then the probe, the sequence and the deviation it must show; ``header`` is its
    docstring."""
    files = (*KIT, ENGINE_KIT) if tool in ENGINE_TOOLS else KIT
    body = "\n".join(kit_body(f, first=(i == 0)) for i, f in enumerate(files))
    doc = '"""' + header.replace('"""', "'''") + '\n"""\n'
    steps = json.dumps([s.to_json() for s in sequence], indent=4)
    dev = json.dumps(deviation, indent=4)
    tail = (f"\n\n# -- this reproducer ------------------------------------------------------------\n"
            f"TOOL = {tool!r}\nPROBE_VARIANT = {probe!r}\nSEQUENCE = {steps}\nDEVIATION = {dev}\n\n"
            f"if __name__ == \"__main__\":\n    sys.exit(main(TOOL, SEQUENCE, DEVIATION, PROBE_VARIANT))\n")
    # JSON's literals are Python's but for these three.
    tail = tail.replace(": true", ": True").replace(": false", ": False").replace(": null", ": None")
    return doc + body + tail


def run_reproducer(path: Path, tool: str, repeat: int, timeout_s: float) -> list[dict[str, Any]]:
    """Run a reproducer on its own ``repeat`` times, each in a fresh interpreter.

    The script imports nothing of cutbench (it is the kit's text); it gets
    only CRIU's command and the plugin's directory from the environment.
    Returns one ``{"exit", "shown", "seconds", "tail"}`` per run: exit 0 means
    the deviation showed, 1 that it did not, 2 that the script could not run,
    124 that it ran past ``timeout_s``.
    """
    import tempfile
    import time

    env = {**os.environ, **environment(tool)}
    out = []
    for _ in range(repeat):
        started = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="cutbench-repro-") as cwd:
            try:
                p = subprocess.run([sys.executable, str(path.resolve())], capture_output=True, text=True,
                                   timeout=timeout_s, env=env, cwd=cwd)
                code, text = p.returncode, p.stdout + p.stderr
            except subprocess.TimeoutExpired as exc:
                code, text = 124, f"timed out after {timeout_s:.0f} s: {exc.stdout!r}"
        out.append({"exit": code, "shown": code == 0, "seconds": round(time.monotonic() - started, 1),
                    "tail": "\n".join(str(text).strip().splitlines()[-12:])})
    return out
