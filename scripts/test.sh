#!/usr/bin/env bash
# The test command: install what is missing, then run every test, the lab tests included
# (the session fixture brings the three-box lab up once; nothing is skipped).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/pytest "$@"
