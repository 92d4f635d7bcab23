#!/bin/sh
# What the service's CI job runs, end to end, on a Linux runner with root
# (CRIU needs it). Artefacts to keep: gate.xml (JUnit, with the gate's
# figures as <property> elements) and results/ (one run directory per arm,
# each with report.html and the trial files that `cutbench replay` takes).
set -eu
cd "$(dirname "$0")"
python3 -m venv .venv
# From a checkout of cutbench (CUTBENCH points at it); a released package installs the same way.
.venv/bin/pip install -q -e "${CUTBENCH:-../..}[test]"
.venv/bin/cutbench criu install                     # CRIU >= 4.2 on PATH, or Debian's package into .criu/
.venv/bin/cutbench doctor                           # prints what is missing and how to fix it; stops the job if CRIU is unusable
# --cutbench-max-invalid-rate overrides the marker's threshold for this job;
# --cutbench-backend would run the same scenarios on another backend.
exec .venv/bin/pytest -q test_gate.py \
  --cutbench-out results \
  --cutbench-max-invalid-rate 0 \
  --junitxml gate.xml
