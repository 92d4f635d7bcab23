#!/bin/bash
# What one device call runs, in the repository root of the GPU machine:
#   scripts/device_run.sh STEP...   (steps below; output and results under $OUT)
# The machine has no network: CRIU travels in .criu/ and missing wheels in .whl/.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
# NVLink multicast stays off in every process (it can take the host's GPUs down).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
# NVIDIA's utility travels in .carry/bin (never committed): on PATH for the cuda-checkpoint backends and the plugin.
[ -d .carry/bin ] && export PATH=$PWD/.carry/bin:$PATH
PY=python3
CB="$PY -m cutbench"
RES=${RES:-/tmp/results}
mkdir -p "$RES"

step_env() {
  nvidia-smi || true
  nvidia-smi --query-gpu=index,name,uuid,memory.used,memory.total --format=csv
  df -h /dev/shm /tmp | cat
  free -g | cat
  uname -r; $PY --version
  which cuda-checkpoint criu || true
  $PY - <<'PY'
import importlib.metadata as m
for n in ("cupy-cuda13x", "cuda-bindings", "nvidia-ml-py", "torch", "nvidia-nccl-cu13", "pandas", "pyarrow", "hypothesis"):
    try: print(n, m.version(n))
    except Exception as e: print(n, "missing")
try:
    from cupy.cuda import nccl
    print("cupy nccl available:", getattr(nccl, "available", "?"), nccl.get_version())
except Exception as e:
    print("cupy nccl:", type(e).__name__, e)
PY
  $CB doctor || true
  $CB doctor --json > "$OUT/doctor.json" 2>&1 || true  # the same checks with their details (the GPU's among them)
}

step_tests() {  # GPU-marked tests (and the CPU-side CUDA tests) on the real GPU
  $PY -m pytest -q -ra -p no:cacheprovider -m "gpu" ${GPU_TESTS:-tests/gpu} --timeout 300 2>&1 | tee "$OUT/pytest-gpu.log" | tail -40
}

# SCENARIO_ARGS: extra `cutbench run` options (e.g. --set plan.phases=["record"]); no globbing.
run_scenario() { set -f; timeout -s INT ${SCENARIO_TIMEOUT:-580} $CB run "scenarios/$1.toml" --out "$RES" ${SCENARIO_ARGS:-} 2>&1 | tail -45; set +f; }
step_quick() { run_scenario gpu-quick; }
step_sweep() { run_scenario gpu-sweep; }
step_multi() { run_scenario multi-gpu; }
step_run() { run_scenario "${SCENARIO:?set SCENARIO=name of scenarios/NAME.toml}"; }
# A program as it is (examples/programs/$PROGRAM/$PROGRAM.toml), e.g. PROGRAM=training.
# PROGRAM_SCENARIO: another scenario of that folder (e.g. PROGRAM=server PROGRAM_SCENARIO=inference).
step_program() { set -f; timeout -s INT ${SCENARIO_TIMEOUT:-580} $CB run "examples/programs/${PROGRAM:?set PROGRAM=name of examples/programs/NAME}/${PROGRAM_SCENARIO:-$PROGRAM}.toml" --out "$RES" ${SCENARIO_ARGS:-} 2>&1 | tail -45; set +f; }
# What tracing a program's system calls costs it (PROGRAM as above; OVERHEAD_REPEAT runs of each arm).
step_overhead() { $PY benchmarks/syscall_overhead.py "examples/programs/${PROGRAM:?set PROGRAM}/${PROGRAM_SCENARIO:-$PROGRAM}.toml" \
    --repeat ${OVERHEAD_REPEAT:-3} --json "$RES/overhead-$PROGRAM.json" 2>&1 | tail -5; }
step_speed() { $PY benchmarks/gpu_speed.py --out "$RES/gpu-speed" ${SPEED_SIZES:+--sizes $SPEED_SIZES} 2>&1 | tail -30; }
step_probe() { $PY benchmarks/cuda_call_while_cut.py --out "$RES/probe" 2>&1 | tail -60; }
# The tool-failure reproducers (benchmarks/repro/): driver API and NVIDIA's utility, CRIU, no harness.
step_repro() {
  for s in ${REPRO:-leave_running_restore cuda_call_in_split_window host_callback_lock}; do
    timeout 300 $PY benchmarks/repro/$s.py --out "$RES/repro" ${REPRO_ARGS:-} 2>&1 | tail -60
  done
  nvidia-smi --query-gpu=driver_version,name --format=csv > "$RES/repro/environment.txt" 2>&1
  $PY -m cutbench doctor >> "$RES/repro/environment.txt" 2>&1 || true
}
# CRIU and its CUDA plugin from the files `cutbench criu install --download-only DIR --with-cuda-plugin`
# wrote on a machine with network (CRIU_OFFLINE, default .carry/criu-offline).
step_criu() { $CB criu install --from "${CRIU_OFFLINE:-.carry/criu-offline}" 2>&1 | tail -3; }
step_plugin() { $CB criu install --from "${CRIU_OFFLINE:-.carry/criu-offline}" --with-cuda-plugin 2>&1 | tail -5; }
# Slurm from the files `cutbench slurm install --download-only DIR` wrote on a machine with network (SLURM_OFFLINE,
# default .carry/slurm-offline), unpacked into .slurm/, and its local cluster started; slurm_down stops it, its logs
# kept under $RES/slurm-logs. slurm_run: examples/slurm/$SLURM_SCENARIO.toml (default training) with SCENARIO_ARGS.
step_slurm() { $CB slurm install --from "${SLURM_OFFLINE:-.carry/slurm-offline}" 2>&1 | tail -3; $CB slurm up 2>&1 | tail -3; }
step_slurm_run() { set -f; timeout -s INT ${SCENARIO_TIMEOUT:-580} $CB run "examples/slurm/${SLURM_SCENARIO:-training}.toml" --out "$RES" ${SCENARIO_ARGS:-} 2>&1 | tail -45; set +f; }
step_slurm_down() { $CB slurm down; mkdir -p "$RES/slurm-logs"; cp /var/lib/cutbench/slurm/*.log "$RES/slurm-logs/" 2>/dev/null; }
# The six criteria over the newest run (criteria.parquet and the report's section in it).
step_criteria() { $CB criteria "$RES/latest" 2>&1 | tail -70; }
# CPH_NAME: a suffix for the output folder (several configurations in one call); CPH_IMAGES_DIR: --images-dir.
step_cph() { $PY benchmarks/cuts_per_hour.py --out "$RES/cuts-per-hour${CPH_NAME:-}" ${CPH_IMAGES_DIR:+--images-dir $CPH_IMAGES_DIR} ${CPH_TRIALS:+--trials $CPH_TRIALS} ${CPH_TRIALS_PER_JOB:+--trials-per-job $CPH_TRIALS_PER_JOB} ${CPH_MIN_TRIALS:+--min-trials $CPH_MIN_TRIALS} ${CPH_JOBS:+--jobs $CPH_JOBS} ${CPH_CUTS:+--cuts-per-trial $CPH_CUTS} ${CPH_SOURCE:+--source $CPH_SOURCE} ${CPH_MAX_SECONDS:+--max-seconds $CPH_MAX_SECONDS} ${CPH_BACKEND:+--backend $CPH_BACKEND} ${CPH_ARRAY:+--array $CPH_ARRAY} ${CPH_BALLAST_MIB:+--ballast-mib $CPH_BALLAST_MIB} ${CPH_BANDWIDTH:+--bandwidth $CPH_BANDWIDTH} 2>&1 | tail -80; }

# The host's bandwidth for a cut's bytes, one copy and BW_PROCESSES (default 16) at once (bandwidth.json under $RES).
# BW_TMPFS: the tmpfs to write and read (default /dev/shm; /mnt/cutbench-images after huge_images).
step_bw() { $PY benchmarks/bandwidth_reference.py --size ${BW_SIZE:-1GiB} --repeat ${BW_REPEAT:-2} --processes ${BW_PROCESSES:-16} \
    ${BW_TMPFS:+--tmpfs $BW_TMPFS} --skip disk --out "$RES/bandwidth${BW_NAME:-}.json" 2>&1 | tail -30; }
# Host memory settings a cut's bytes go through, recorded before a tuning step changes them: transparent huge
# pages (anonymous memory: the driver's staging, CRIU's restored mappings) and the images' tmpfs.
step_memory() {
  for f in enabled defrag shmem_enabled; do echo "thp $f: $(cat /sys/kernel/mm/transparent_hugepage/$f 2>&1)"; done
  grep -E ' /dev/shm | /tmp ' /proc/mounts; grep -E 'MemTotal|MemFree|HugePages_Total|AnonHugePages|ShmemHugePages' /proc/meminfo
}
# THP=always|madvise|never: set transparent huge pages for anonymous memory (step_memory shows the value found).
step_thp() { echo "${THP:?set THP=always|madvise|never}" > /sys/kernel/mm/transparent_hugepage/enabled && step_memory; }
# A tmpfs with huge pages for the images at /mnt/cutbench-images (HUGE_IMAGES_SIZE, default 96g); then
# CPH_IMAGES_DIR=/mnt/cutbench-images points cuts_per_hour at it.
step_huge_images() {
  mkdir -p /mnt/cutbench-images && mount -t tmpfs -o "size=${HUGE_IMAGES_SIZE:-96g},huge=always" cutbench-images /mnt/cutbench-images
  grep cutbench-images /proc/mounts
}

# What semantic adapters cost a cut and how fast one they cannot join is aborted, persistent_kernel's drain too.
step_adapters() { timeout ${ADAPTERS_TIMEOUT:-400} $PY benchmarks/adapter_pause.py ${ADAPTERS_GPU:---gpu} --out "$RES/adapter-pause" ${ADAPTERS_ARGS:-} 2>&1 | grep -v '^\[' | tail -40; }

# The CUDA support matrix: every probe row through every tool here, faults none and kill (MATRIX_ARGS: e.g. --probe X).
step_matrix() { set -f; timeout -s INT ${MATRIX_TIMEOUT:-540} $CB matrix --out "$RES" --jobs ${MATRIX_JOBS:-12} ${MATRIX_ARGS:-} 2>&1 | tail -${MATRIX_TAIL:-150}; set +f; }

# The lifecycle hunt (`cutbench hunt`) for each of HUNT_TOOLS; hunt directories packed as $OUT/hunt.tgz.
# HUNT_BUDGET / HUNT_WALK: seconds of directed search / random walk per tool; HUNT_REPEAT: standalone runs of each reproducer.
step_hunt() {
  for t in ${HUNT_TOOLS:-cuda-checkpoint}; do
    timeout -s INT ${HUNT_TIMEOUT:-560} $CB hunt --tool "$t" --budget ${HUNT_BUDGET:-120} --random-walk ${HUNT_WALK:-0} \
      --repeat ${HUNT_REPEAT:-3} --bound ${HUNT_BOUND:-30} --length ${HUNT_LENGTH:-10} --out "$RES/hunt" 2>&1 | tail -40
    nvidia-smi --query-compute-apps=pid,used_memory --format=csv
  done
  (cd "$RES" && tar czf "$OUT/hunt${PACK_NAME:-}.tgz" hunt)
}

# Pack every run directory small enough to come back (parquet, md, toml, json, png).
step_pack() {
  (cd "$RES" && find . -name latest -prune -o -type f \( -name '*.parquet' -o -name '*.md' -o -name '*.toml' \
      -o -name '*.png' -o -name '*.csv' -o -name '*.json' -o -name '*.html' -o -name '*.log' \) -print \
      | tar czf "$OUT/results${PACK_NAME:-}.tgz" -T -)
  ls -la "$OUT"
}

for step in "$@"; do
  echo "=== $step $(date +%T)"
  start=$(date +%s)
  "step_$step"
  echo "=== $step done in $(( $(date +%s) - start ))s"
done
