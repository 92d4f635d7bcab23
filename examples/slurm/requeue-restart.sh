#!/bin/bash
# A requeue from scratch: the preempted job goes back to the queue and the
# program starts again from its beginning, repeating what it had done.
#
# cutbench submits it as: sbatch --partition=... requeue-restart.sh PROGRAM ARGS...
#SBATCH --requeue
#SBATCH --open-mode=append
set -u
srun --ntasks=1 "$@"
status=$?
if [ "$status" -ne 0 ]; then
  scontrol requeue "$SLURM_JOB_ID"
fi
exit "$status"
