#!/bin/sh
# Installs Debian's headless-capable Chromium when absent, so the report test
# can open report.html in a real browser. Fails loudly if it cannot.
set -eu
for name in chromium chromium-browser; do
  if command -v "$name" >/dev/null 2>&1; then
    exit 0
  fi
done
if [ "$(id -u)" != 0 ]; then
  echo "Chromium missing and not root: install Debian's package 'chromium'" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >/dev/null
command -v chromium >/dev/null
