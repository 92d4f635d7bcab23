"""The child of ``probe_ipc``: ``python -m cutbench.workloads.probes.ipc_child HANDLE_HEX WORDS RFD WFD``.

Opens the parent's CUDA IPC memory handle, answers ``ready``, then for every op read from ``RFD`` steps
the shared buffer, synchronises and answers ``ok`` on ``WFD`` (an error's text instead, then leaves);
``quit`` closes the handle and leaves.
"""

from __future__ import annotations

import os
import sys


def main(argv: list[str]) -> int:
    """Serve the parent until ``quit``; return the exit status."""
    handle, words, rfd, wfd = bytes.fromhex(argv[0]), int(argv[1]), int(argv[2]), int(argv[3])
    with os.fdopen(rfd, "r") as rin, os.fdopen(wfd, "w", buffering=1) as wout:
        try:
            import cupy
            from cupy.cuda import runtime

            from cutbench.workloads.probes import launch_step
            from cutbench.workloads.probes.allocation import device_words

            ptr = runtime.ipcOpenMemHandle(handle)
            shared = device_words(ptr, words, None)
        except Exception as exc:
            wout.write(f"error: {type(exc).__name__}: {exc}\n")
            return 1
        wout.write("ready\n")
        for line in rin:
            if line.strip() == "quit":
                break
            try:
                launch_step(shared, int(line) * 31 + 7)
                cupy.cuda.Device().synchronize()
                wout.write("ok\n")
            except Exception as exc:
                wout.write(f"error: {type(exc).__name__}: {exc}\n")
                return 1
        runtime.ipcCloseMemHandle(ptr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
