"""Entry point of a workload process: ``python -m cutbench.workloads.launch CONFIG.json``.

Exit codes: 0 finished and reported; 1 the workload raised (traceback in its
log); 3 stopped by the harness; 4 a park was never released.
``--check WORKLOAD [PATH...]`` only imports the workload (exit 0, or 1 with the traceback on stderr).
"""

from __future__ import annotations

import os
import sys

from cutbench.receivers.client import workload_client_name
from cutbench.workloads import api
from cutbench.workloads.control import ControlFile
from cutbench.workloads.runtime import (Runtime, TrackedReceiver, WorkloadConfig, format_exception, since_exec,
                                        write_log)
from cutbench.errors import ArrayBackendUnavailable
from cutbench.workloads.xp import get_xp, is_device


def main(argv: list[str] | None = None) -> int:
    """Run the workload described by the config file; return the exit code."""
    imported = since_exec()  # interpreter start and the imports above
    args = sys.argv[1:] if argv is None else argv
    resume = None
    if args[:1] == ["--check"] and len(args) >= 2:
        # Before any trial, the harness asks whether a workload process can import this workload at all.
        api.load(args[1], args[2:])
        return 0
    if len(args) == 3 and args[1] == "--resume":
        # The `app` backend's restore: a fresh process loads a saved state.
        args, resume = args[:1], args[2]
    if len(args) != 1:
        print("usage: python -m cutbench.workloads.launch CONFIG.json [--resume STATE] | --check WORKLOAD [PATH...]", file=sys.stderr)
        return 2
    config = WorkloadConfig.load(args[0])
    control = ControlFile(config.control_path)
    control.set("pid", os.getpid())
    try:
        cls = api.load(config.workload, config.workload_path, environ=True)
    except Exception:  # its words go to the trial's log, where the harness reads a workload's last words
        write_log(config.log_path, control.get("incarnation"), f"failed: cannot load workload {config.workload!r}:\n"
                  + format_exception())
        return 1
    # Before CUDA starts in this process: the driver reads e.g. CUDA_MODULE_LOADING at its initialisation.
    os.environ.update(api.optional(cls, "environment"))
    try:
        # "auto" by the workload's own ``arrays``: a torch-only workload gets torch.
        xp = get_xp(api.resolve_array(cls, config.array_backend))
    except ArrayBackendUnavailable as exc:  # the harness checks first; a direct launch may not
        write_log(config.log_path, control.get("incarnation"), f"failed: {exc}")
        return 1
    rt = Runtime(config=config, control=control, xp=xp, phases=tuple(cls.phases),
                 argv=(sys.executable, "-m", "cutbench.workloads.launch", args[0]))
    rt.startup["imports"] = round(imported, 6)
    rt.mark_startup("array_library")
    control.set("on_device", 1 if is_device(rt.xp) else 0)
    try:
        if config.receiver:
            # Named for the trial: before a restore the harness waits until no connection of this name is open.
            rt.receiver = TrackedReceiver(config.receiver, control, token=config.receiver_token,
                                          client_name=workload_client_name(config.trial))
        workload = cls(rt, config.params)
        workload.setup()
        if rt.desk is not None:  # an adapter must stand for a domain the workload declares
            rt.desk.check_domains(api.declared_domains(cls, config.params))
        rt.mark_startup("setup")
        first = 1
        own = getattr(workload, "continue_from_own_checkpoint", None)
        if resume is not None:
            # An optional member of the protocol: the app backend resumes only workloads that have it.
            first = int(workload.load_state(resume)) + 1  # type: ignore[attr-defined]
            rt.mark_startup("load_state")
            control.set("load_count", control.get("load_count") + 1)
        elif callable(own) and (after := int(own())) > 0:
            # The program's own restart path found its checkpoint on disk and continues after op `after`.
            first = after + 1
            rt.mark_startup("load_state")
            control.set("own_resumed_op", after)
            control.set("own_resumes", control.get("own_resumes") + 1)
        else:
            control.set("fresh_starts", control.get("fresh_starts") + 1)
        rt.log(f"start {cls.name} ops={config.params.get('ops')} first={first}")
        for op in range(first, int(config.params["ops"]) + 1):
            workload.run_op(op)
            if op == first:
                rt.mark_startup("first_op")  # the first op done: warm-up (lazy loading, compiles) included
            rt.boundary(op, workload)
        finish = getattr(workload, "finish", None)
        if callable(finish):  # stop background device work before the report
            finish()
        rt.write_report(workload.report())
        rt.log("done")
        return 0
    except SystemExit as stop:
        rt.log(f"stopped with code {stop.code}")
        return int(stop.code or 0)
    except BaseException:
        rt.log("failed:\n" + format_exception())
        return 1


if __name__ == "__main__":
    sys.exit(main())
