"""A tool's lifecycle driven by hand, with no cutbench in it: the hunt's hands and every reproducer's body.

``cutbench hunt`` drives its sequences through :class:`Session`, and each
reproducer it writes is the kit's text (:mod:`~cutbench.harness.nemesis.probe_kit`,
then this file, their ``# kit-import`` lines dropped) followed by one
``SEQUENCE`` and a call to :func:`main`. So what a reproducer shows on its own
is exactly what the hunt saw; a deviation its reproducer does not show is the
harness's bug. Only the standard library is imported here.

A session starts the probe (``probe_kit.PROBE``), which holds buffers (on the
GPU, or Python lists on the CPU) and obeys numbered command files in its
directory (``cmd.N`` → ``ack.N``). Between commands it makes no CUDA call, so
it can be locked, checkpointed, dumped and restored while it waits. Every
answer a tool gives is classed as ``ok``, ``refused`` (the tool said no, with
its words in ``detail``), ``hang`` (past the bound) or ``gone`` (the process
is not there).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from cutbench.harness.nemesis.probe_kit import (BOUND_S, FILL_LEFT_MIB, FILLER, PROBE, PROBES, Driver,  # kit-import
                                                 Hang, Utility, alive, become_subreaper, criu_argv,  # kit-import
                                                 reap, release_network_lock)  # kit-import


class Session:
    """One probe under one tool; :meth:`do` runs an action and returns what was seen, :meth:`close` what was left.

    ``tool``: ``cuda`` (the driver API), ``cuda-checkpoint`` (NVIDIA's
    utility), ``criu-cuda-plugin`` (CRIU with ``--libdir`` at ``libdir``)
    or ``criu`` (a CPU probe). ``criu``: CRIU's command prefix and ``libdir``
    the plugin's directory (by default ``$HUNT_CRIU``, else ``criu`` on PATH,
    and ``$HUNT_CRIU_LIBDIR``). ``probe``: the probe's variant (:data:`PROBES`).
    The probe's GPU buffers, its pointers and its second threads' results are
    checked after every step (:meth:`digest`), but for a step left at its
    launch: its work is still in flight when the next step comes.
    """

    GPU_TOOLS = ("cuda", "cuda-checkpoint", "criu-cuda-plugin")

    def __init__(self, tool: str, bound_s: float = BOUND_S, criu: list[str] | None = None,
                 libdir: str | None = None, env: dict[str, str] | None = None, probe: str = "buffers") -> None:
        self.tool = tool
        # The variables the session reads (HUNT_*, an engine's DOCKER_HOST): this process's, with ``env`` over them.
        self.env = {**os.environ, **(env or {})}
        self.criu = criu or criu_argv()
        self.libdir = libdir or self.env.get("HUNT_CRIU_LIBDIR")
        self.kind = "gpu" if tool in self.GPU_TOOLS else "cpu"
        if probe not in PROBES[self.kind]:
            raise RuntimeError(f"no {self.kind} probe {probe!r}; the probes are {', '.join(PROBES[self.kind])}")
        self.probe = probe
        self.bound_s = bound_s
        self.api: Utility | Driver | None = (
            Utility(bound_s) if tool == "cuda-checkpoint" else Driver(bound_s) if tool in ("cuda", "criu-cuda-plugin")
            else None)
        become_subreaper()  # a probe CRIU restored is re-parented to us, and we collect it
        self.dir = Path(tempfile.mkdtemp(prefix="cutbench-hunt-"))
        self.images = self.dir / "images"
        self.seq = 0
        self.pids: set[int] = set()
        self.extra: list[subprocess.Popen[bytes]] = []
        # What the probe must hold: one [elements, value] per buffer; the image's copy of it after a dump.
        self.expected: list[list[float]] = [[0, 1.0]]
        self.image: dict[str, Any] | None = None
        self.threads = 0
        self.ptrs: list[int] | None = None
        self.pid: int | None = self._start()

    # -- the probe -------------------------------------------------------
    def _start(self) -> int:
        log = open(self.dir / "probe.log", "ab")
        proc = subprocess.Popen([sys.executable, "-c", PROBE, str(self.dir), self.kind, self.probe],
                                stdin=subprocess.DEVNULL,
                                stdout=log, stderr=log, start_new_session=True)
        log.close()
        deadline = time.monotonic() + self.bound_s
        while not (self.dir / "ready").exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"the probe did not start: {self.log_tail()}")
            time.sleep(0.01)
        self.pids.add(proc.pid)
        return proc.pid

    def log_tail(self, n: int = 5) -> str:
        """The probe's last lines of output (its last words when it dies)."""
        try:
            lines = (self.dir / "probe.log").read_text(errors="replace").strip().splitlines()
            return " | ".join(lines[-n:])
        except OSError:
            return ""

    def command(self, op: str, **args: Any) -> dict[str, Any]:
        """Send the probe one command; its answer, ``{"hang": …}`` past the bound, ``{"gone": …}`` if it died."""
        self.seq += 1
        tmp = self.dir / f"cmd.{self.seq}.tmp"
        tmp.write_text(json.dumps({"op": op, **args}))
        tmp.rename(self.dir / f"cmd.{self.seq}")
        ack = self.dir / f"ack.{self.seq}"
        deadline = time.monotonic() + self.bound_s
        while not ack.exists():
            if not alive(self.pid):
                return {"gone": self.log_tail()}
            if time.monotonic() > deadline:
                return {"hang": f"probe command {op} past {self.bound_s:.0f} s"}
            time.sleep(0.002)
        return dict(json.loads(ack.read_text()))

    def state(self) -> str:
        """The tool's word for the probe's state now: running, locked, checkpointed, failed, or gone."""
        if not alive(self.pid):
            return "gone"
        if self.api is None:
            return "running"
        try:
            s = self.api.call(self.pid or 0, "state")
        except Hang:
            return "hang"
        for word in ("running", "locked", "checkpointed", "failed"):
            if word in s.lower():
                return word
        return s

    # -- the actions ---------------------------------------------------------
    def do(self, action: str, **args: Any) -> dict[str, Any]:
        """Run one action; returns ``{action, args, answer, detail, state, seconds}``."""
        started = time.monotonic()
        try:
            detail = getattr(self, "_" + action)(**args)
        except Hang as exc:
            detail = f"hang: {exc}"
        answer = classify(detail)
        return {"action": action, "args": args, "answer": answer, "detail": detail, "state": self.state(),
                "seconds": round(time.monotonic() - started, 3)}

    def observe(self, action: str, **args: Any) -> dict[str, Any]:
        """Run :meth:`do`, then, when the probe runs, its digest: ``continues`` (and ``continues_detail`` when not).

        A step left at its launch is not digested: the digest would wait for its work, and the next step is
        to find it in flight."""
        obs = self.do(action, **args)
        if obs["state"] == "running" and obs["answer"] != "hang" and args.get("phase") != "launch":
            d = self.digest()
            obs["continues"] = d["ok"]
            obs["continues_detail"] = d["detail"]
        return obs

    def _api(self, op: str, **kw: Any) -> str:
        if self.api is None:
            return "harness: this tool has no such call"
        if not alive(self.pid):
            return "gone"
        return self.api.call(self.pid or 0, op, **kw)

    def _lock(self, timeout_ms: int = 5000) -> str:
        return self._api("lock", timeout_ms=timeout_ms)

    def _unlock(self) -> str:
        return self._api("unlock")

    def _checkpoint(self) -> str:
        return self._api("checkpoint")

    def _restore(self) -> str:
        return self._api("restore")

    def _restore_other_gpu(self) -> str:
        """A restore onto another GPU than the one checkpointed (device 1; the driver API only)."""
        if not isinstance(self.api, Driver):
            return "harness: only the driver API's restore takes GPU pairs here"
        return self._api("restore_other")

    def _fill(self) -> subprocess.Popen[bytes] | None:
        """Start a process that takes the GPU's free memory but FILL_LEFT_MIB; None when it could not."""
        filler = subprocess.Popen([sys.executable, "-c", FILLER, str(FILL_LEFT_MIB)], stdout=subprocess.PIPE,
                                  stderr=subprocess.DEVNULL, start_new_session=True)
        self.extra.append(filler)
        assert filler.stdout is not None
        if filler.stdout.readline().startswith(b"filled"):
            return filler
        self._unfill(filler)
        return None

    def _unfill(self, filler: subprocess.Popen[bytes]) -> None:
        filler.kill()
        filler.wait()
        time.sleep(0.5)  # its memory is released after its exit

    def _restore_filled(self) -> str:
        """A restore while another process holds all of the GPU's free memory but FILL_LEFT_MIB."""
        filler = self._fill()
        if filler is None:
            return "harness: the filler did not fill the GPU"
        try:
            return self._api("restore")
        finally:
            self._unfill(filler)

    def _criu_restore_filled(self) -> str:
        """A CRIU restore (with the CUDA plugin) while another process holds the GPU's free memory."""
        filler = self._fill()
        if filler is None:
            return "harness: the filler did not fill the GPU"
        try:
            return self._criu_restore()
        finally:
            self._unfill(filler)

    def _respawn(self) -> str:
        """A fresh probe in place of a gone one (the image, if any, is forgotten)."""
        if alive(self.pid):
            self._kill()
        for p in list(self.dir.glob("cmd.*")) + list(self.dir.glob("ack.*")) + [self.dir / "ready"]:
            p.unlink(missing_ok=True)
        self.seq, self.threads, self.ptrs, self.image = 0, 0, None, None
        self.expected = [[0, 1.0]]
        self.pid = self._start()
        return "ok"

    def _kill(self) -> str:
        if not alive(self.pid):
            return "gone"
        os.kill(self.pid or 0, signal.SIGKILL)
        reap(self.pid or 0)
        return "ok"

    def _signal(self) -> str:
        """SIGSTOP, then SIGCONT a moment later."""
        if not alive(self.pid):
            return "gone"
        os.kill(self.pid or 0, signal.SIGSTOP)
        time.sleep(0.1)
        os.kill(self.pid or 0, signal.SIGCONT)
        return "ok"

    def _probe(self, op: str, **kw: Any) -> str:
        if not alive(self.pid):
            return "gone"
        out = self.command(op, **kw)
        if "hang" in out:
            raise Hang(out["hang"])
        if "gone" in out:
            return "gone: " + out["gone"]
        return "ok" if "error" not in out else "refused: " + out["error"]

    def _step(self, k: int = 1, phase: str = "device_done") -> str:
        """Work on every buffer; ``phase="launch"``: left with its GPU work (a CPU probe's thread) in flight."""
        res = self._probe("step", k=k, phase=phase)
        if res == "ok":
            for b in self.expected:
                b[1] += k
        return res

    def _alloc(self) -> str:
        value = float(len(self.expected) + 1)
        res = self._probe("alloc", value=value)
        if res == "ok":
            self.expected.append([1, value])
            self.ptrs = None  # a new buffer: pointers are taken afresh
        return res

    def _free(self) -> str:
        res = self._probe("free")
        if res == "ok" and len(self.expected) > 1:
            self.expected.pop()
            self.ptrs = None
        return res

    def _thread_call(self) -> str:
        """Start a second thread's CUDA call (it may block: the probe answers without waiting for it)."""
        self.threads += 1
        return self._probe("thread", n=self.threads)

    def _fork(self, exec_: bool = False) -> str:
        return self._probe("fork", exec=exec_)

    def _criu(self, *args: str) -> str:
        self.images.mkdir(exist_ok=True)
        argv = [*self.criu, *args, "-D", str(self.images), "-v2", "--network-lock", "nftables",
                *(["--libdir", self.libdir] if self.libdir and self.tool == "criu-cuda-plugin" else [])]
        try:
            p = subprocess.run(argv, capture_output=True, text=True, timeout=self.bound_s)
        except subprocess.TimeoutExpired as exc:
            raise Hang(f"criu {args[0]} past {self.bound_s:.0f} s") from exc
        if p.returncode == 0:
            return "ok"
        log = self.images / f"{args[0]}.log"
        lines = log.read_text(errors="replace").splitlines() if log.exists() else p.stderr.splitlines()
        errs = [ln.split(": ", 1)[-1].strip() for ln in lines if "Error" in ln]
        return "refused: criu " + args[0] + ": " + " | ".join(errs[-2:] or [f"exit {p.returncode}"])

    def _criu_dump(self, leave_running: bool = False) -> str:
        if not alive(self.pid):
            return "gone"
        release_network_lock(self.images)  # the image this dump replaces is never restored
        shutil.rmtree(self.images, ignore_errors=True)
        res = self._criu("dump", "-t", str(self.pid), "-o", "dump.log", *(["--leave-running"] if leave_running else []))
        if res == "ok":
            self._take_image()
            if not leave_running:
                reap(self.pid or 0)
        return res

    def _criu_restore(self) -> str:
        if self.image is None:
            return "harness: no image to restore"
        pidfile = self.dir / "restored.pid"
        pidfile.unlink(missing_ok=True)
        if not alive(self.pid):
            # While the original runs, the restore cannot take its pid and the files stay its own.
            self._forget_after_image()
        res = self._criu("restore", "-d", "--pidfile", str(pidfile), "-o", "restore.log")
        if res == "ok":
            self.pid = int(pidfile.read_text())
            self.pids.add(self.pid)
            self._back_to_image()
        return res

    # -- an image's probe ------------------------------------------------------
    def _take_image(self) -> None:
        """What the image just taken holds: every command sent so far was answered before it, so its probe
        waits for the next one."""
        self.image = {"expected": [list(b) for b in self.expected], "ptrs": self.ptrs, "seq": self.seq,
                      "threads": self.threads}

    def _forget_after_image(self) -> None:
        """Commands the original answered after the image are not the copy's: it must not find them when it wakes."""
        assert self.image is not None
        for p in list(self.dir.glob("cmd.*")) + list(self.dir.glob("ack.*")):
            parts = p.name.split(".")
            if len(parts) == 2 and int(parts[1]) > self.image["seq"]:
                p.unlink(missing_ok=True)

    def _back_to_image(self) -> None:
        """After a restore: the probe holds what the image held, and answers from the image's next command."""
        assert self.image is not None
        self.expected = [list(b) for b in self.image["expected"]]
        self.ptrs, self.seq, self.threads = self.image["ptrs"], self.image["seq"], self.image["threads"]

    # -- what must hold -------------------------------------------------------
    def digest(self) -> dict[str, Any]:
        """Check the probe continues identically; returns ``{"ok": bool, "detail": str}``.

        Asked only when the probe is running: its buffers hold what the commands
        it answered put there, its buffers' addresses are the ones it had, and
        every second-thread call it was given has returned with the right value.
        """
        out = self.command("digest")
        if "hang" in out or "gone" in out:
            return {"ok": False, "detail": f"digest: {out.get('hang') or 'the probe died: ' + out['gone']}"}
        spans = out["spans"]
        want = [(b[1], b[1]) for b in self.expected]
        if [tuple(s) for s in spans] != want:
            return {"ok": False, "detail": f"buffers hold {spans}, expected {want}"}
        if "mirror" in out and tuple(out["mirror"]) != want[0]:
            return {"ok": False, "detail": f"the pinned host mirror of buffer 0 holds {out['mirror']}, expected {want[0]}"}
        if self.ptrs is not None and out["ptrs"] != self.ptrs:
            return {"ok": False, "detail": f"buffer addresses moved: {self.ptrs} -> {out['ptrs']}"}
        self.ptrs = out["ptrs"]
        deadline = time.monotonic() + self.bound_s
        while len(out["threads"]) < self.threads and time.monotonic() < deadline:
            time.sleep(0.05)
            out = self.command("digest")
            if "threads" not in out:
                return {"ok": False, "detail": f"digest: {out}"}
        bad = {n: t for n, t in out["threads"].items() if t["value"] != 2048.0}
        if len(out["threads"]) < self.threads or bad:
            return {"ok": False, "detail": f"second-thread calls: {self.threads} started, returned {out['threads']}"}
        return {"ok": True, "detail": ""}

    def close(self) -> list[str]:
        """Kill everything this session started; returns what was left behind (each as a sentence)."""
        for p in self.extra:
            if p.poll() is None:
                p.kill()
                p.wait()
        for pid in self.pids:
            if alive(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                reap(pid)
        if self.api is not None:
            self.api.close()
        release_network_lock(self.images)
        left = [f"process {pid} still runs after SIGKILL" for pid in self.pids if alive(pid)]
        if self.kind == "gpu":
            left += gpu_leftovers(self.pids)
        shutil.rmtree(self.dir, ignore_errors=True)
        if self.dir.exists():
            left.append(f"{self.dir} could not be removed")
        return left


# The session class of each tool that needs its own (a container engine's: engine_kit); Session otherwise.
SESSIONS: dict[str, type[Session]] = {}


def gpu_leftovers(pids: set[int], settle_s: float = 10.0) -> list[str]:
    """The probe's pids that still hold GPU memory ``settle_s`` after they died (``nvidia-smi``)."""
    deadline = time.monotonic() + settle_s
    held: set[int] = set()
    while True:
        try:
            out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=30).stdout
        except (OSError, subprocess.TimeoutExpired):
            return []
        held = {int(w) for w in out.split() if w.isdigit()} & pids
        if not held or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    return [f"pid {p} still holds GPU memory {settle_s:.0f} s after it was killed" for p in sorted(held)]


def classify(detail: str) -> str:
    """Return ``ok``, ``hang``, ``gone``, ``harness`` (the kit's own trouble) or ``refused``: the class of an answer."""
    if detail == "ok" or detail.startswith("ok"):
        return "ok"
    for word in ("hang", "gone", "harness"):
        if detail.startswith(word):
            return word
    return "refused"


# -- a reproducer's main ----------------------------------------------------------
def replay(tool: str, sequence: list[dict[str, Any]], bound_s: float = BOUND_S,
           probe: str = "buffers") -> list[dict[str, Any]]:
    """Run ``sequence`` (``{"action", "args"}`` steps) on a fresh ``probe``; returns each step's observation.

    Each step is observed as :meth:`Session.observe` does; the last
    observation is the session's leftovers.
    """
    session = SESSIONS.get(tool, Session)(tool, bound_s, probe=probe)
    seen = []
    try:
        for step in sequence:
            obs = session.observe(step["action"], **step.get("args", {}))
            seen.append(obs)
            print(f"  {step['action']} {step.get('args') or ''}: {obs['answer']} ({obs['detail'][:160]}) "
                  f"-> {obs['state']}" + ("" if obs.get("continues", True) else
                                          f"; does not continue: {obs['continues_detail']}"), flush=True)
            if obs["answer"] == "hang":
                break
    finally:
        left = session.close()
    seen.append({"action": "close", "args": {}, "answer": "ok" if not left else "refused",
                 "detail": "; ".join(left) or "ok", "state": "gone", "seconds": 0.0})
    return seen


def shows(observed: dict[str, Any], deviation: dict[str, Any]) -> bool:
    """Whether an observation shows the recorded deviation (same answer class, state, continuation)."""
    keys = ("answer", "state") if deviation.get("invariant") != "continues_identically" else ("continues",)
    return all(observed.get(k) == deviation["observed"].get(k) for k in keys)


def main(tool: str, sequence: list[dict[str, Any]], deviation: dict[str, Any], probe: str = "buffers") -> int:
    """A reproducer's command line: replay the sequence; exit 0 when the deviation shows, 1 when not, 2 when it cannot run."""
    import argparse

    ap = argparse.ArgumentParser(description=f"{tool}: {deviation.get('summary', '')}")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--json", help="write every run's observations here")
    args = ap.parse_args()
    runs = []
    for i in range(args.repeat):
        print(f"run {i + 1}: {tool}, the {probe} probe, {len(sequence)} steps", flush=True)
        try:
            seen = replay(tool, sequence, probe=probe)
        except Exception as exc:  # noqa: BLE001 - reported: the reproducer could not run here
            print(f"cannot run: {type(exc).__name__}: {exc}", file=sys.stderr)
            return 2
        at = deviation["step"]
        shown = at < len(seen) and seen[at]["action"] == deviation["action"] and shows(seen[at], deviation)
        print(f"run {i + 1}: the deviation {'SHOWS' if shown else 'does not show'}: {deviation.get('summary', '')}",
              flush=True)
        runs.append({"shown": shown, "observations": seen})
    if args.json:
        Path(args.json).write_text(json.dumps(runs, indent=2))
    return 0 if all(r["shown"] for r in runs) else 1
