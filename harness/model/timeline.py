"""The trial timeline: every pipeline stage and harness event, timed.

Clock: ``time.monotonic()``; a stage starts when its call is issued and stops
when the call returns. Times are stored in seconds since the trial started.
Each stage is tagged with the receiver's high-water mark (largest arrival
sequence number) before and after, so effects can be placed on the timeline.

With a CPU sampler (:class:`CpuSampler`; the runner's is
``cutbench.harness.nemesis.cpu_account.StageSampler``) each stage also
gets the CPU-seconds, page faults and bytes written of the trial's processes
between its start and its end (:data:`CPU_COLUMNS`, docs/cpu-accounting.md).
The samples are taken outside the timed span, so ``duration_s`` does not
include them; without a sampler, and on events, those columns are None.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Protocol

from cutbench.errors import StageFailed, StageRefused

# Per stage: CPU-seconds of every process the trial involves (cpu_s) and of each role, page faults and bytes
# written (docs/cpu-accounting.md); None where no sampler ran. Stored runs made before them read as NaN.
CPU_ROLES = ("workload", "cuda_threads", "criu", "tool", "receiver", "harness")
CPU_COLUMNS = ("cpu_s", "cpu_user_s", "cpu_sys_s", *(f"cpu_{r}_s" for r in CPU_ROLES), "minflt", "majflt",
               "write_bytes", "wchar_bytes")
# Stages of the harness itself (start the workload, wait for its cut, run it to its end), not of the checkpoint
# pipeline: the workload's own running, left out of the stage-time breakdown.
HARNESS_STAGES = frozenset({"spawn", "reach_cut", "run_to_end"})


class CpuSampler(Protocol):
    """What the timeline asks at a stage's start and end to fill :data:`CPU_COLUMNS`."""

    def sample(self, extra_pids: Sequence[int] = (), *, tight: bool = False) -> Any:
        """A reading of the trial's processes now (``extra_pids``: processes the stage brought into being;
        ``tight``: as cheap as can be, between stages that must follow each other closely)."""
        ...

    def columns(self, before: Any, after: Any) -> dict[str, Any]:
        """The :data:`CPU_COLUMNS` between two readings."""
        ...


class Timeline:
    """Collects stage rows for one trial (see :meth:`rows`)."""

    def __init__(self, trial_id: str, hwm: Callable[[], int | None] | None = None, cpu: CpuSampler | None = None):
        self.trial_id = trial_id
        self.t0 = time.monotonic()
        self._hwm = hwm or (lambda: None)
        self._cpu = cpu
        self._rows: list[dict[str, Any]] = []

    def _mark(self) -> int | None:
        try:
            return self._hwm()
        except Exception:  # the receiver being down must not break timing
            return None

    def _cpu_sample(self, extra_pids: Sequence[int] = (), *, tight: bool = False) -> Any:
        if self._cpu is None:
            return None
        try:
            return self._cpu.sample(extra_pids, tight=tight)
        except Exception:  # accounting must never break a stage: the row's CPU columns stay empty
            return None

    def _cpu_columns(self, before: Any, extra: dict[str, Any], *, tight: bool) -> dict[str, Any]:
        empty = dict.fromkeys(CPU_COLUMNS)
        if before is None or self._cpu is None:
            return empty
        pid = extra.get("pid")
        after = self._cpu_sample([pid] if isinstance(pid, int) else [], tight=tight)
        if after is None:
            return empty
        try:
            return {**empty, **self._cpu.columns(before, after)}
        except Exception:
            return empty

    @contextmanager
    def stage(self, name: str, cut_index: int = 0, *, marks: bool = True) -> Iterator[dict[str, Any]]:
        """Time the enclosed block as stage ``name``; yields a dict for extra fields (``bytes``, ``detail``, and
        ``pid``: a process the stage brought into being, such as a restore's, whose CPU counts as the workload's).

        ``marks``: ask the receiver's high-water mark before and after (a round
        trip each). Off for stages that must follow each other closely (one
        driver call per rank of a coordinated cut); their CPU samples are then
        the sampler's tight ones (CPU times only, a few reads).
        """
        extra: dict[str, Any] = {}
        hwm_before = self._mark() if marks else None
        cpu_before = self._cpu_sample(tight=not marks)
        start = time.monotonic()
        result, error = "ok", ""
        try:
            yield extra
        except StageRefused as exc:
            result, error = "refused", exc.reason
            raise
        except StageFailed as exc:
            result, error = "failed", exc.reason
            raise
        except BaseException as exc:
            result, error = "failed", f"{type(exc).__name__}: {exc}"
            raise
        finally:
            end = time.monotonic()
            cpu = self._cpu_columns(cpu_before, extra, tight=not marks)
            self._rows.append(
                {
                    "trial_id": self.trial_id,
                    "cut_index": cut_index,
                    "stage": name,
                    "t_start": start - self.t0,
                    "t_end": end - self.t0,
                    "duration_s": end - start,
                    "result": result,
                    "error": error,
                    "hwm_before": hwm_before,
                    "hwm_after": self._mark() if marks else None,
                    "bytes": extra.get("bytes"),
                    "detail": extra.get("detail", ""),
                    **cpu,
                }
            )

    def event(self, name: str, cut_index: int = 0, detail: str = "") -> None:
        """Record an instantaneous event (zero-length stage)."""
        now = time.monotonic() - self.t0
        hwm = self._mark()
        self._rows.append(
            {
                "trial_id": self.trial_id,
                "cut_index": cut_index,
                "stage": name,
                "t_start": now,
                "t_end": now,
                "duration_s": 0.0,
                "result": "event",
                "error": "",
                "hwm_before": hwm,
                "hwm_after": hwm,
                "bytes": None,
                "detail": detail,
                **dict.fromkeys(CPU_COLUMNS),
            }
        )

    def rows(self) -> list[dict[str, Any]]:
        """All rows recorded so far, in order."""
        return list(self._rows)
