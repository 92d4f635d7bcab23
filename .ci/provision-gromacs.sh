#!/bin/sh
# Installs Debian's GROMACS when absent, so the program tests run GROMACS as it is
# (examples/programs/gromacs). Fails loudly if it cannot.
set -eu
if command -v gmx >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "GROMACS missing and not root: install Debian's package 'gromacs'" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends gromacs >/dev/null
command -v gmx >/dev/null
