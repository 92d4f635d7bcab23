"""The trial timeline: every pipeline stage and harness event, timed.

Clock: ``time.monotonic()``; a stage starts when its call is issued and stops
when the call returns. Times are stored in seconds since the trial started.
Each stage is tagged with the receiver's high-water mark (largest arrival
sequence number) before and after, so effects can be placed on the timeline.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from cutbench.errors import StageFailed, StageRefused


class Timeline:
    """Collects stage rows for one trial (see :meth:`rows`)."""

    def __init__(self, trial_id: str, hwm: Callable[[], int | None] | None = None):
        self.trial_id = trial_id
        self.t0 = time.monotonic()
        self._hwm = hwm or (lambda: None)
        self._rows: list[dict[str, Any]] = []

    def _mark(self) -> int | None:
        try:
            return self._hwm()
        except Exception:  # the receiver being down must not break timing
            return None

    @contextmanager
    def stage(self, name: str, cut_index: int = 0, *, marks: bool = True) -> Iterator[dict[str, Any]]:
        """Time the enclosed block as stage ``name``; yields a dict for extra fields (``bytes``, ``detail``).

        ``marks``: ask the receiver's high-water mark before and after (a round
        trip each). Off for stages that must follow each other closely (one
        driver call per rank of a coordinated cut).
        """
        extra: dict[str, Any] = {}
        hwm_before = self._mark() if marks else None
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
            }
        )

    def rows(self) -> list[dict[str, Any]]:
        """All rows recorded so far, in order."""
        return list(self._rows)
