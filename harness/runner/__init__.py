"""The runner: the interpreter that owns processes and time.

``trial`` runs one trial end to end, its cuts armed by ``arming``, the workload process's files and
processes (its configuration, companions, the target of a cut, its report) in ``process``, in a
``Session`` (``session``: receiver, work directory), which holds what the
trials share (``shared``: image discards, per-thread clients and backends,
references, the support matrix, the receiver's watch); ``coordinator`` sits at a cut's stage boundaries for
certificates and effect fences; ``run`` turns a scenario into trials and
stores the run, after ``checks`` has refused what cannot run (arms this
machine lacks, programs that cannot start, storage nearly full), with
``runmeta`` saying what ``run.toml`` holds; ``resume`` continues a partial
run (``cutbench run --resume``); ``executors`` holds the ways of running them (serial, worker
threads: ``workers``, an adaptive driver), chosen once per run, and
``ray_executor`` the Ray one (the cluster), whose tasks (``ray_tasks``) each
run ``trial_worker`` (one trial in a process of its own), as each task of
``slurm_executor``'s job array does; ``adaptive`` hosts the driver that decides trial by trial (the
Hypothesis search); ``replay`` reruns a stored trial;
``catalog`` lists what a run can be made of here (``cutbench list``);
``program`` runs a program that knows nothing of cutbench, judged from
what it shows the outside world, and ``program_certifier`` certifies its cuts from that and its files.

The table of trial runners is filled here, below: ``Session.runner`` takes
the first whose ``runs`` says it runs a trial's workload (``session`` cannot
import the runners, which import it).
"""

from cutbench.harness.runner.program import ProgramRunner as _ProgramRunner
from cutbench.harness.runner.session import RUNNERS as _RUNNERS
from cutbench.harness.runner.trial import TrialRunner as _TrialRunner

_RUNNERS[:] = [_ProgramRunner, _TrialRunner]  # each runs what the other does not (a program; a workload class)
