#!/bin/sh
# Installs Debian's container engines when absent — Docker (docker.io, with
# runc) and Podman — so the docker and podman backend tests run against real
# engines. The tests start and stop the project's own dockerd themselves
# (`cutbench engine start docker`). Fails loudly if it cannot install.
set -eu
if command -v dockerd >/dev/null 2>&1 && command -v podman >/dev/null 2>&1 && command -v runc >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "container engines missing and not root: install packages 'docker.io' and 'podman'" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq docker.io podman runc >/dev/null
command -v dockerd >/dev/null && command -v podman >/dev/null
