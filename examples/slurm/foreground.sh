#!/bin/bash
# Broken on purpose: requeue-resume.sh with the program in the batch script's
# foreground instead of a job step. Slurm signals job steps when a
# preemption's grace time begins; a batch script's foreground program hears
# nothing until the job is killed at the grace time's end, then has KillWait
# seconds before SIGKILL. The node is freed a grace time later, and a
# program whose save takes longer than KillWait loses it.
#
# cutbench submits it as: sbatch --partition=... foreground.sh PROGRAM ARGS...
#SBATCH --requeue
#SBATCH --open-mode=append
set -u
if [ "${SLURM_RESTART_COUNT:-0}" -gt 0 ]; then
  eval "set -- \"\$@\" ${RESUME_ARGS:-}"
fi
"$@"
