"""What the reproducers share: a CuPy child of the workloads' shape, the two CUDA witnesses, and CRIU.

Nothing here comes from the harness's pipeline: the driver calls go through
cuda-bindings directly and the utility through its executable, so a failure
seen here is the tool's, whatever the harness does. From cutbench come what a
backend's author has too (:mod:`cutbench.backend`): CRIU's command (the
bundled ``.criu/`` or a CRIU >= 4.2 on PATH) and the release of the network
lock a dump never restored leaves; and the environment ``cutbench doctor``
reports.

The child (:data:`CHILD`) runs ops ``1..N`` like the ``counter`` workload:
``launch`` enqueues ``state += op`` on the GPU, ``device_done`` synchronises,
then ``host_ms`` of host-only work. It can park at one ``op/phase`` (it
writes ``parked`` and polls for ``go`` in pure Python, making no CUDA call),
and at the end writes ``result`` (ops done, state sum) and exits 0.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from cutbench.backend import release_network_lock, require_criu  # noqa: E402
from cutbench.procs import become_subreaper, is_zombie_or_gone  # noqa: E402

CHILD = textwrap.dedent("""
    import os, sys, time, json, cupy as cp
    d, ops, park, host_ms, cb = sys.argv[1], int(sys.argv[2]), sys.argv[3], float(sys.argv[4]), sys.argv[5]
    def at(op, phase):
        if f"{op}/{phase}" == park:
            open(os.path.join(d, "parked"), "w").write(park)
            while not os.path.exists(os.path.join(d, "go")):
                time.sleep(0.001)
    state = cp.zeros(1 << 20, dtype=cp.float32)
    stream = cp.cuda.get_current_stream()
    def wait_in_callback(_):
        # a host callback on the stream that waits for the harness (cause 3)
        while not os.path.exists(os.path.join(d, "cb_go")):
            time.sleep(0.001)
    for op in range(1, ops + 1):
        state += op
        if cb == "callback" and op == 2:
            stream.launch_host_func(wait_in_callback, None)
        at(op, "launch")
        stream.synchronize()
        at(op, "device_done")
        if host_ms:
            time.sleep(host_ms / 1000.0)
    json.dump({"ops": ops, "sum": float(state.sum()), "pid": os.getpid()}, open(os.path.join(d, "result"), "w"))
""")


def expected_sum(ops: int, n: int = 1 << 20) -> float:
    """The state's sum after ``ops`` ops: every element is 1 + 2 + … + ops (exact in float32)."""
    return float(n * ops * (ops + 1) // 2)


class Driver:
    """The CUDA driver's checkpoint API through cuda-bindings (the harness process initialises the driver)."""

    name = "driver"

    def __init__(self) -> None:
        from cuda.bindings import driver as drv

        self.drv = drv
        (err,) = drv.cuInit(0)
        if int(err):
            raise RuntimeError(f"cuInit: {err.name}")

    def _ok(self, result: Any) -> str:
        err = result[0] if isinstance(result, tuple) else result
        return "ok" if int(err) == 0 else err.name

    def state(self, pid: int) -> str:
        """The process state, lower-cased, or the error name."""
        r = self.drv.cuCheckpointProcessGetState(pid)
        return r[1].name.removeprefix("CU_PROCESS_STATE_").lower() if int(r[0]) == 0 else r[0].name

    def lock(self, pid: int, timeout_ms: int = 5000) -> str:
        args = self.drv.CUcheckpointLockArgs()
        args.timeoutMs = timeout_ms
        return self._ok(self.drv.cuCheckpointProcessLock(pid, args))

    def checkpoint(self, pid: int) -> str:
        return self._ok(self.drv.cuCheckpointProcessCheckpoint(pid, None))

    def restore(self, pid: int) -> str:
        return self._ok(self.drv.cuCheckpointProcessRestore(pid, None))

    def unlock(self, pid: int) -> str:
        return self._ok(self.drv.cuCheckpointProcessUnlock(pid, None))


class Utility:
    """NVIDIA's ``cuda-checkpoint`` executable, one invocation per call (the second witness)."""

    name = "utility"

    def __init__(self) -> None:
        self.exe = shutil.which("cuda-checkpoint")
        if self.exe is None:
            raise RuntimeError("cuda-checkpoint is not on PATH")

    def _run(self, pid: int, *args: str) -> str:
        p = subprocess.run([self.exe, *args, "--pid", str(pid)], capture_output=True, text=True, timeout=120)
        out = (p.stdout + p.stderr).strip()
        return (out or "ok") if p.returncode == 0 else f"exit {p.returncode}: {out}"

    def state(self, pid: int) -> str:
        return self._run(pid, "--get-state").lower()

    def lock(self, pid: int, timeout_ms: int = 5000) -> str:
        return self._run(pid, "--action", "lock", "--timeout", str(timeout_ms))

    def checkpoint(self, pid: int) -> str:
        return self._run(pid, "--action", "checkpoint")

    def restore(self, pid: int) -> str:
        return self._run(pid, "--action", "restore")

    def unlock(self, pid: int) -> str:
        return self._run(pid, "--action", "unlock")


def witnesses(names: list[str]) -> list[Any]:
    """The witnesses asked for that exist here (the utility only when it is on PATH)."""
    out = []
    for name in names:
        try:
            out.append(Driver() if name == "driver" else Utility())
        except Exception as exc:  # noqa: BLE001 - reported, not fatal
            print(f"witness {name} unavailable: {exc}", file=sys.stderr)
    return out


def criu_argv() -> list[str]:
    """CRIU's command, as cutbench runs it."""
    return list(require_criu().argv)


@dataclass
class Case:
    """One run of a sequence: its name, the steps with what each returned, and the verdict."""

    name: str
    witness: str
    steps: list[dict[str, Any]] = field(default_factory=list)
    verdict: str = ""

    def step(self, what: str, result: Any, **extra: Any) -> Any:
        row = {"step": what, "result": result, "t": round(time.monotonic(), 3), **extra}
        self.steps.append(row)
        print(f"  {self.name} [{self.witness}] {what}: {result}" + (f" {extra}" if extra else ""), flush=True)
        return result


class Child:
    """A CuPy child of :data:`CHILD` in its own session, with its work directory."""

    def __init__(self, ops: int, park: str, host_ms: float = 0.0, callback: bool = False):
        self.dir = Path(tempfile.mkdtemp(prefix="cutbench-repro-"))
        self.ops = ops
        log = open(self.dir / "child.log", "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(self.dir), str(ops), park, str(host_ms), "callback" if callback else "-"],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
        log.close()
        self.pid = self.proc.pid

    def wait_parked(self, timeout: float = 60.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if (self.dir / "parked").exists():
                return True
            if self.proc.poll() is not None:
                return False
            time.sleep(0.005)
        return False

    def go(self) -> None:
        (self.dir / "go").touch()

    def hold(self) -> None:
        (self.dir / "go").unlink(missing_ok=True)

    def alive(self, pid: int | None = None) -> bool:
        return not is_zombie_or_gone(pid or self.pid)

    def result(self) -> dict[str, Any] | None:
        try:
            return json.loads((self.dir / "result").read_text())
        except (OSError, ValueError):
            return None

    def correct(self) -> bool:
        r = self.result()
        return bool(r) and r["ops"] == self.ops and r["sum"] == expected_sum(self.ops)

    def log_tail(self, n: int = 5) -> str:
        try:
            return " | ".join((self.dir / "child.log").read_text(errors="replace").strip().splitlines()[-n:])
        except OSError:
            return ""

    def criu(self, *args: str, timeout: float = 120.0) -> str:
        """Run CRIU; "ok" or the exit status and the last error lines of its log."""
        images = self.dir / "images"
        images.mkdir(exist_ok=True)
        p = subprocess.run(criu_argv() + list(args) + ["-D", str(images), "-v2", "--network-lock", "nftables"],
                           capture_output=True, text=True, timeout=timeout)
        if p.returncode == 0:
            return "ok"
        log = images / f"{args[0]}.log"
        lines = log.read_text(errors="replace").splitlines() if log.exists() else []
        errs = [ln.strip() for ln in lines if "Error" in ln]
        return f"exit {p.returncode}: " + " | ".join(errs[-3:])

    def dump(self, leave_running: bool) -> str:
        return self.criu("dump", "-t", str(self.pid), "-o", "dump.log", *(["--leave-running"] if leave_running else []))

    def restore(self) -> tuple[str, int | None]:
        pidfile = self.dir / "restored.pid"
        res = self.criu("restore", "-d", "--pidfile", str(pidfile), "-o", "restore.log")
        try:
            return res, int(pidfile.read_text())
        except (OSError, ValueError):
            return res, None

    def reap(self, pid: int | None = None, timeout: float = 30.0) -> int | None:
        """Wait for ``pid`` (ours or re-parented to us) to exit; SIGKILL it at the timeout. Returns its status."""
        pid = pid or self.pid
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                done, status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                return None
            if done:
                return os.waitstatus_to_exitcode(status)
            time.sleep(0.01)
        self.kill(pid)
        return self.reap(pid, 5.0)

    def resume_original(self, case: Case, w: Any) -> None:
        """Bring the original's GPU side back (restore, unlock) and release its park."""
        case.step("restore original", w.restore(self.pid))
        case.step("unlock original", w.unlock(self.pid))
        self.go()

    def restore_copy(self, case: Case, w: Any, settle: float = 0.0) -> bool:
        """CRIU-restore the image (held parked), then the CUDA restore and unlock, then release it.

        ``settle``: seconds to wait before the CRIU restore. Returns whether the
        copy finished with the right state; every step is recorded in ``case``.
        """
        self.hold()
        (self.dir / "result").unlink(missing_ok=True)
        if settle:
            time.sleep(settle)
        res, pid = self.restore()
        case.step("criu restore", res, pid=pid)
        if pid is None:
            return False
        case.step("state of the copy", w.state(pid))
        if case.step("restore copy", w.restore(pid)) != "ok":
            case.step("state after", w.state(pid))
            case.step("copy alive", self.alive(pid))
            self.kill(pid)
            self.reap(pid)
            return False
        case.step("unlock copy", w.unlock(pid))
        self.go()
        status = case.step("copy exit", self.reap(pid))
        ok = case.step("copy finished correctly", status == 0 and self.correct(), copy_result=self.result())
        if not ok:
            case.step("child log", self.log_tail())
        return ok

    def kill(self, pid: int | None = None) -> None:
        try:
            os.kill(pid or self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def close(self) -> None:
        (self.dir / "cb_go").touch()
        self.go()
        self.kill()
        release_network_lock(self.dir / "images")  # a stopped dump never restored keeps CRIU's lock otherwise
        shutil.rmtree(self.dir, ignore_errors=True)


def environment() -> dict[str, Any]:
    """What a verdict depends on here, as ``cutbench doctor --json`` reports it (kernel, CRIU, the GPU and its
    driver, the checkpoint API, NVIDIA's utility, the packages): check name → its detail."""
    p = subprocess.run([sys.executable, "-m", "cutbench", "doctor", "--json"], capture_output=True, text=True,
                       timeout=300)
    try:
        return {c["name"]: c["detail"] for c in json.loads(p.stdout)}
    except ValueError:
        return {"doctor": f"exit {p.returncode}: {p.stderr.strip()[-500:]}"}


def main(doc: str, name: str, run_case: Any, cases: tuple[tuple[Any, ...], ...] = ((),)) -> int:
    """A reproducer's command line: ``--out DIR``, ``--witness driver utility``, ``--repeat N``.

    Runs ``run_case(witness, *case)`` for every witness, case and repeat, then
    prints and stores the verdicts (:func:`write`) as ``OUT/NAME.json``; returns the exit status.
    """
    import argparse

    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--out")
    ap.add_argument("--witness", nargs="+", default=["driver", "utility"])
    ap.add_argument("--repeat", type=int, default=1)
    args = ap.parse_args()
    become_subreaper()
    write(args.out, name, [run_case(w, *c) for w in witnesses(args.witness) for c in cases for _ in range(args.repeat)])
    return 0


def write(out: str | None, name: str, cases: list[Case]) -> None:
    """Print the verdict table and store every case with the environment as ``OUT/NAME.json``."""
    print(f"\n{name}:")
    for c in cases:
        print(f"  {c.verdict:<10} {c.witness:<8} {c.name}")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        doc = {"environment": environment(), "cases": [c.__dict__ for c in cases]}
        (Path(out) / f"{name}.json").write_text(json.dumps(doc, indent=2))
