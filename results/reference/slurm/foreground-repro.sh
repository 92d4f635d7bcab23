#!/bin/bash
# Without cutbench: a program in a batch script's foreground, preempted by a job of a higher partition.
# Slurm signals the job's steps when a preemption's grace time begins, not the batch script: the foreground program
# hears nothing and runs on. The node is taken back only when Slurm cancels the job at a later pass (12-15 s after
# the preemptor's submission here, with GraceTime=3): the program gets SIGTERM then, KillWait before SIGKILL, and the
# job is requeued. A program that ends before that pass ends the job itself: Slurm records it TIMEOUT (it ended
# after its preemption's end time) and does not requeue it, its work done.
# Needs a cluster with partitions low (PreemptMode=REQUEUE, a GraceTime) and high, e.g. `cutbench slurm up`
# (SLURM_CONF=/var/lib/cutbench/slurm/slurm.conf). STEPS (default 200, 100 ms each) sets how long the program runs.
# Prints the job's states as they change and when the program heard SIGTERM.
set -u
steps=${STEPS:-200}
dir=$(mktemp -d)
cat > "$dir/job.sh" <<JOB
#!/bin/bash
#SBATCH --requeue
#SBATCH --open-mode=append
python3 -c '
import signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: (print("SIGTERM at", time.strftime("%T"), flush=True), sys.exit(143)))
for i in range($steps):
    print("step", i, flush=True); time.sleep(0.1)
'
JOB
job=$(sbatch --parsable --partition=low --chdir="$dir" --output="$dir/out" "$dir/job.sh")
until squeue -h -j "$job" -o %T | grep -q RUNNING; do sleep 0.2; done
sleep 1
preemptor=$(sbatch --parsable --partition=high --exclusive --output=/dev/null --wrap "sleep 1")
echo "$(date +%T.%N | cut -c1-12) preemptor $preemptor submitted"
last=""
for _ in $(seq 1 600); do
  state=$(scontrol show job -o "$job" | grep -o 'JobState=[A-Z_]* Reason=[A-Za-z_]*' || true)
  [ "$state" != "$last" ] && echo "$(date +%T.%N | cut -c1-12) job $job $state" && last=$state
  case "$state" in *RUNNING*) ;; *) break;; esac
  sleep 0.1
done
echo "the program said: $(grep -c '^step' "$dir/out") steps; then: $(grep -v '^step' "$dir/out" | tr '\n' ' ')"
scancel "$job" "$preemptor" 2>/dev/null
rm -rf "$dir"
