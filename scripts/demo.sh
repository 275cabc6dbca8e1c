#!/usr/bin/env bash
# The main job on the local lab: install what is missing, bring the three-box lab up (real
# sshd, dockerd, registry and lobes deployments in network namespaces), validate the desired
# state, then print the mesh's drift report. Exit codes follow `reconcile drift`: 0 in sync,
# 2 drift (the pristine lab is lobes' own render, so expect drift), 1 a box not observed.
set -euo pipefail
cd "$(dirname "$0")/.."
# The demo opens no browser: Chromium (only the HTML report's test needs it) is left out.
FLEET_SETUP_SKIP_TEST_TOOLS=1 bash scripts/setup.sh
.venv/bin/python -m lab up
export FLEET_INVENTORY=lab
.venv/bin/reconcile validate
exec .venv/bin/reconcile drift
