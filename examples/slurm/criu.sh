#!/bin/bash
# CRIU from the job script: on the preemption's signal the program is dumped, and the requeued job restores it.
#
# - The batch script starts the program in a session of its own, writing to the job's output files (CRIU reopens a
#   file by its path on restore; a pipe to Slurm's step would come back connected to nothing). Outside any job
#   step: Slurm signals every process of the job's steps when the grace time begins, and a program's own handler
#   may end it there (PyTorch's DataLoader workers install one for SIGTERM, whatever their parent ignores), before
#   it can be dumped. The batch script is not signalled (foreground.sh).
# - A job step watches it instead: Slurm's SIGTERM ends the step with 143, and the script dumps the program into
#   criu-images/ in the job's directory (CRIU kills it once dumped) and requeues the job (as requeue-resume.sh
#   does). A step that ends with the program ended normally.
# - Requeued, with an image there, the script runs `criu restore` where it ran the program: CRIU stays the
#   restored program's parent, so the program is the job's (Slurm tracks the job's descendants); the step watches
#   CRIU, which ends when the program does, with its status. The restored program has its pid again.
# - Unless the scheduler decided otherwise: where $CUTBENCH_DECISION names a file that says "restart" (cutbench
#   writes it under pipeline.certify = "enforce" when the image's certificate is not eligible), the image is put
#   aside and the program starts again from the beginning, in its directory as it was at the job's first start.
# - --file-locks: a program may hold file locks (SQLite does); CRIU dumps and restores them.
# - A program on a GPU: where NVIDIA's cuda-checkpoint is installed, each of the program's processes that it says
#   runs CUDA is toggled first (its GPU state into its host memory: CRIU dumps no GPU), and toggled again once CRIU
#   has resumed it (CRIU's post-resume action). A dump that fails toggles them back: the program runs on.
#
# cutbench submits it as: sbatch --partition=... criu.sh PROGRAM ARGS...; $CRIU names the project's CRIU,
# $CUDA_CHECKPOINT NVIDIA's utility (default: cuda-checkpoint on PATH).
#SBATCH --requeue
#SBATCH --open-mode=append
set -u
images="$PWD/criu-images"
criu=${CRIU:-criu}
cuda=${CUDA_CHECKPOINT:-cuda-checkpoint}
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
tree() { echo "$1"; for child in $(cat /proc/"$1"/task/*/children 2>/dev/null); do tree "$child"; done; }
dump() {  # the program of pid $1 into $images: its CUDA processes toggled first, then CRIU
  local pids="" toggled="" p
  if command -v "$cuda" >/dev/null; then
    for p in $(tree "$1"); do
      "$cuda" --get-state --pid "$p" 2>/dev/null | grep -qiw running && pids="$pids $p"
    done
  fi
  rm -f "$images/cuda-pids"
  for p in $pids; do "$cuda" --toggle --pid "$p" && toggled="$toggled $p" || break; done
  if [ "$toggled" = "$pids" ]; then
    [ -z "$pids" ] || echo $pids > "$images/cuda-pids"
    "$criu" dump --file-locks -t "$1" -D "$images" -o dump.log && return 0
  fi
  for p in $toggled; do "$cuda" --toggle --pid "$p"; done
  return 1
}
if [ -f "$images/inventory.img" ]; then
  resume=()
  if [ -s "$images/cuda-pids" ]; then
    printf '#!/bin/sh\n[ "$CRTOOLS_SCRIPT_ACTION" = post-resume ] || exit 0\nfor p in %s; do "%s" --toggle --pid "$p" || exit 1; done\n' \
      "$(cat "$images/cuda-pids")" "$cuda" > "$images/cuda-resume.sh"
    chmod +x "$images/cuda-resume.sh"
    resume=(--action-script "$images/cuda-resume.sh")
  fi
  "$criu" restore --file-locks -D "$images" -o restore.log "${resume[@]}" &
  runner=$!
  pid=$(cat "$images/program.pid")
else
  mkdir -p "$images"
  setsid "$@" < /dev/null >> "$out" 2>> "$err" &
  runner=$! pid=$!
  echo "$pid" > "$images/program.pid"
fi
srun --ntasks=1 bash -c 'trap "exit 143" TERM; while kill -0 "$1" 2>/dev/null; do sleep 0.2; done' watch "$runner"
if [ $? -eq 143 ]; then
  dump "$pid" && status=143 || status=1
else
  wait "$runner"
  status=$?
fi
if [ "$status" -ne 0 ]; then
  scontrol requeue "$SLURM_JOB_ID"
fi
exit "$status"
