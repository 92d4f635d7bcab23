#!/bin/sh
# Installs Debian's PostgreSQL server binaries when absent, so the store tests
# can start a throwaway cluster with initdb/pg_ctl. Fails loudly if it cannot.
set -eu
if ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "PostgreSQL server binaries missing and not root: install package 'postgresql'" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends postgresql >/dev/null
ls /usr/lib/postgresql/*/bin/initdb >/dev/null
