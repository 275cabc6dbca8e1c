#!/usr/bin/env bash
# The test command: install what is missing, then run every test, the lab tests included
# (the session fixture brings the three-box lab up once; nothing is skipped).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# Two workers: the unit tests run beside the lab tests, which mostly wait (tests/conftest.py).
# Arguments come after, so `-n 0` runs in this one process.
exec .venv/bin/pytest -n 2 "$@"
