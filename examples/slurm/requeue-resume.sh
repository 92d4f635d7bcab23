#!/bin/bash
# The application's own checkpoint under preemption, done right.
#
# - The program runs as a job step (srun): Slurm signals job steps (SIGCONT,
#   SIGTERM) the moment the grace time of a preemption begins, so the program
#   saves within the grace time. A program in the batch script's foreground
#   hears nothing until the job is killed (foreground.sh).
# - --requeue: the preempted job goes back to the queue (no-requeue.sh).
# - A program that saved and stopped on the signal has ended the job before
#   Slurm requeued it: the script requeues it itself (as PyTorch Lightning
#   does), else the job counts as done with its work unfinished.
# - Requeued (SLURM_RESTART_COUNT > 0), the program starts with its own
#   restart flag ($RESUME_ARGS: cutbench passes workload.params.resume).
#
# cutbench submits it as: sbatch --partition=... requeue-resume.sh PROGRAM ARGS...
#SBATCH --requeue
#SBATCH --open-mode=append
set -u
if [ "${SLURM_RESTART_COUNT:-0}" -gt 0 ]; then
  eval "set -- \"\$@\" ${RESUME_ARGS:-}"
fi
srun --ntasks=1 "$@"
status=$?
if [ "$status" -ne 0 ]; then
  scontrol requeue "$SLURM_JOB_ID"
fi
exit "$status"
