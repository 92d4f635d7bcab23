#!/bin/sh
# Installs Debian's Slurm (slurmctld, slurmd, its clients) and MUNGE when absent, so the slurm backend's tests
# preempt jobs on a real scheduler. The tests start and stop the project's own one-node cluster themselves
# (`cutbench slurm up` / `down`). Fails loudly if it cannot install.
set -eu
if command -v slurmctld >/dev/null 2>&1 && command -v slurmd >/dev/null 2>&1 && command -v sbatch >/dev/null 2>&1 \
  && command -v munged >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "Slurm missing and not root: install packages 'slurmctld slurmd slurm-client munge'" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge >/dev/null
command -v slurmctld >/dev/null && command -v sbatch >/dev/null
