#!/bin/bash
# Broken on purpose: criu.sh as it was (the program in the job step), the requeued job's restore detached (`criu
# restore -d`). CRIU restores the program and exits, the restored program is re-parented to init, outside the job,
# and the job ends COMPLETED at once: Slurm counts the node free while the program runs on (as CRIU issues #3078
# and #2605 describe a restore outside the job's cgroup), and the next preemption cannot reach it.
#
# cutbench submits it as: sbatch --partition=... criu-detached.sh PROGRAM ARGS...; $CRIU names the project's CRIU.
#SBATCH --requeue
#SBATCH --open-mode=append
set -u
images="$PWD/criu-images"
criu=${CRIU:-criu}
if [ -f "$images/inventory.img" ]; then
  srun --ntasks=1 "$criu" restore -d -D "$images" -o restore.log
  status=$?
else
  job=$(scontrol show job "$SLURM_JOB_ID")
  out=$(printf '%s\n' "$job" | sed -n 's/^ *StdOut=//p')
  err=$(printf '%s\n' "$job" | sed -n 's/^ *StdErr=//p')
  mkdir -p "$images"
  srun --ntasks=1 bash -c '
    images=$1 criu=$2 out=$3 err=$4; shift 4
    (trap "" TERM; exec setsid "$@" < /dev/null >> "$out" 2>> "$err") &
    pid=$!
    trap "\"\$criu\" dump -t $pid -D \"\$images\" -o dump.log && exit 143; exit 1" TERM
    wait "$pid"
  ' step "$images" "$criu" "$out" "$err" "$@"
  status=$?
fi
if [ "$status" -ne 0 ]; then
  scontrol requeue "$SLURM_JOB_ID"
fi
exit "$status"
