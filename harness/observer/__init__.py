"""The observer: what the outside world sees of a program that knows nothing of cutbench (docs/programs.md).

``streams`` holds :class:`~cutbench.harness.observer.streams.Observer`: the program started with its stdout
and stderr piped to readers here, outside the checkpointed tree, like a log collector or a client would be;
the stream the scenario names (a pipe, a file the program appends to, a socket it connects to, or a server's
responses) turned into effects ``(stream, index, payload)`` by the workload's effects rule, each tagged with
the incarnation that showed it; the program's last words; the trial's effects table. ``clients`` holds
cutbench's own clients of a server (N streamed requests at once, new ones admitted mid-stream, each retry
policy after a broken stream). ``syscalls`` starts a program stopped and traces its system calls through
``tracer`` (a process of its own, ptrace): the calls that make its effects visible or durable, counted, and the
program held just before the k-th of them for a cut of phase ``syscall`` (docs/programs.md, "Cuts at system calls").

It starts the program where the runner asks, runs cutbench's clients of a server, reads what the program
shows, and holds a traced program where a cut asks; it runs no tool. The runner's
:mod:`~cutbench.harness.runner.program` places the cuts and drives the pipeline.
"""
