#!/bin/bash
# Broken on purpose: requeue-resume.sh without --requeue, and without the
# script's own requeue. A preempted job is not requeued: the program's work
# after the preemption never happens (the trial is lost).
#
# cutbench submits it as: sbatch --partition=... no-requeue.sh PROGRAM ARGS...
#SBATCH --no-requeue
#SBATCH --open-mode=append
set -u
if [ "${SLURM_RESTART_COUNT:-0}" -gt 0 ]; then
  eval "set -- \"\$@\" ${RESUME_ARGS:-}"
fi
srun --ntasks=1 "$@"
