#!/usr/bin/env bash
# Install everything the project needs on a fresh Debian 12 machine (idempotent, as root):
# the lab's system packages and compose plugin, then a virtualenv with the project.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -f .ci/setup-machine.sh ]; then
  bash .ci/setup-machine.sh
fi
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
# editable_mode=compat: a plain path entry in a .pth file. setuptools' default editable finder
# is a module that every Python start imports (with pathlib, urllib.parse, fnmatch): ~30 ms of
# each `reconcile` run, the controller's largest fixed cost after httpx (BENCHMARKS.md).
# -c: the exact versions CI last passed with (requirements/constraints.txt says why).
.venv/bin/pip install --quiet --disable-pip-version-check -e '.[test]' \
  -c requirements/constraints.txt --config-settings editable_mode=compat
# An editable install compiles nothing: compile the package now (as pip does for a normal
# install) so `reconcile` starts from bytecode even where PYTHONDONTWRITEBYTECODE is set.
.venv/bin/python -m compileall -q -j 0 reconciler lab roles deploys >/dev/null
