#!/usr/bin/env bash
# The main job on the local lab: install what is missing, bring the three-box lab up, then
# validate the desired state against the lab inventory and show what it would pin on thor.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/python -m lab up
export FLEET_INVENTORY=lab
.venv/bin/reconcile validate
.venv/bin/reconcile show thor
