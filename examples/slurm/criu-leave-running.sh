#!/bin/bash
# Broken on purpose: criu.sh as it was (the program in the job step), the dump made `--leave-running`. The program
# runs on after its image is taken, until Slurm kills the job at the end of its grace time: what it writes
# meanwhile (its database, its output) is ahead of the image the requeued job restores, a moment that never
# existed. Under pipeline.certify = "enforce" the certificate sees the program's files written after the image
# (with workload.params.domains = ["disk"] and checkpoint_file = "criu-images/inventory.img") and decides
# "restart".
#
# What criu.sh does otherwise:
#
# - The job step (srun) starts the program in a session of its own, writing to the job's output files (CRIU
#   reopens a file by its path on restore; a pipe to Slurm's step would come back connected to nothing), with
#   SIGTERM ignored: Slurm signals every process of the step when the grace time begins, and the program must be
#   there to be dumped.
# - The step's shell traps that SIGTERM and dumps the program into criu-images/ in the job's directory (CRIU kills
#   it once dumped), then ends the step with 143, and the script requeues the job (as requeue-resume.sh does).
# - Requeued, with an image there, the step is `criu restore` in the foreground: CRIU stays the restored program's
#   parent, so the program is the job's (Slurm tracks the step's descendants), and the step ends when it does.
# - Unless the scheduler decided otherwise: where $CUTBENCH_DECISION names a file that says "restart" (cutbench
#   writes it under pipeline.certify = "enforce" when the image's certificate is not eligible), the image is put
#   aside and the program starts again from the beginning, in its directory as it was at the job's first start.
# - --file-locks: a program may hold file locks (SQLite does); CRIU dumps and restores them.
#
# cutbench submits it as: sbatch --partition=... criu-leave-running.sh PROGRAM ARGS...; $CRIU names the project's CRIU.
#SBATCH --requeue
#SBATCH --open-mode=append
set -u
images="$PWD/criu-images"
criu=${CRIU:-criu}
decision=${CUTBENCH_DECISION:-}
job=$(scontrol show job "$SLURM_JOB_ID")
out=$(printf '%s\n' "$job" | sed -n 's/^ *StdOut=//p')
err=$(printf '%s\n' "$job" | sed -n 's/^ *StdErr=//p')
[ -f .job-start-files ] || ls -A > .job-start-files  # the directory as it was at the job's first start
if [ -f "$images/inventory.img" ] && [ -n "$decision" ] && [ "$(cat "$decision" 2>/dev/null)" = restart ]; then
  # Start again from the beginning: the image aside, what the program wrote since the first start removed.
  mv "$images" "$images.declined-${SLURM_RESTART_COUNT:-0}"
  ls -A | while IFS= read -r name; do
    case "$name" in .job-start-files|criu-images.declined-*|"${out##*/}"|"${err##*/}"|"${decision##*/}") continue ;; esac
    grep -qxF -- "$name" .job-start-files || rm -rf -- "$name"
  done
fi
if [ -f "$images/inventory.img" ]; then
  srun --ntasks=1 "$criu" restore --file-locks -D "$images" -o restore.log
  status=$?
else
  mkdir -p "$images"
  srun --ntasks=1 bash -c '
    images=$1 criu=$2 out=$3 err=$4; shift 4
    (trap "" TERM; exec setsid "$@" < /dev/null >> "$out" 2>> "$err") &
    pid=$!
    trap "\"\$criu\" dump --file-locks --leave-running -t $pid -D \"\$images\" -o dump.log" TERM
    while kill -0 "$pid" 2>/dev/null; do wait "$pid"; done  # on after the dump, until Slurm kills the job
    wait "$pid"
  ' step "$images" "$criu" "$out" "$err" "$@"
  status=$?
fi
if [ "$status" -ne 0 ]; then
  scontrol requeue "$SLURM_JOB_ID"
fi
exit "$status"
