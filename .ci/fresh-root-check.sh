#!/usr/bin/env bash
# Prove the set-up on a machine that has nothing: a fresh Debian 12 root (the lab's cached
# debootstrap rootfs: minbase + python3 + curl + ca-certificates, built from the Debian mirror
# on first use) with a copy of the repository, where `bash scripts/setup.sh` (the README's
# first command before `lab up`: .ci/setup-machine.sh, then the project's venv) runs inside
# chroot; .ci/setup-machine.sh runs once more and must change nothing. Then, in there:
# `docker compose version` and `lobes --version`, as root and as an unprivileged user (the
# lab's box users run both), `reconcile --version`, and the README's offline audit replay
# (no lab in there). The host's own packages cannot help: nothing of the host is visible in
# the root but what is mounted below.
#
# What the root borrows from the host, and why:
# - /proc, /sys, /dev, /dev/pts: apt, dpkg maintainer scripts and pip need them.
# - /etc/resolv.conf: the names of the Debian mirror and the Python index.
# - apt.conf.d: how this machine's network reaches the Debian mirror (no proxy here, but a
#   snapshot mirror needs Check-Valid-Until off); the sources stay the rootfs's own (Debian).
# - CAs this machine trusts beyond Debian's (PyPI may be reached through a TLS proxy).
# - pip's configuration (/etc/pip.conf, ~/.config/pip, PIP_* variables) and every local
#   directory it names (find-links, file:// indexes), read-only: PyPI may be a local mirror.
# A policy-rc.d keeps package scripts from starting services (dockerd, sshd) from inside the
# root: they would run on this machine, outside any namespace.
#
# Usage: bash .ci/fresh-root-check.sh [SETUP_SCRIPT]   (as root; 2-3 minutes, mostly downloads;
# SETUP_SCRIPT defaults to .ci/setup-machine.sh: another one shows that the check can fail)
set -euo pipefail
setup=$(realpath "${1:-$(dirname "$0")/setup-machine.sh}")
cd "$(dirname "$0")/.."
REPO=$PWD
CACHE_DIR=${FLEET_LAB_CACHE_DIR:-/var/cache/fleet-lab}
started=$SECONDS

if [[ $(id -u) != 0 ]]; then
    echo "fresh-root-check: must run as root (chroot, mount)" >&2
    exit 1
fi

# The lab's cached rootfs; built now (debootstrap from Debian) if `lab up` has not made it.
tarball=$(find "$CACHE_DIR/rootfs" -maxdepth 1 -name 'debian-bookworm-*.tar' -printf '%T@ %p\n' \
              2>/dev/null | sort -rn | awk '{print $2; exit}')
if [[ -z $tarball || ! -e $tarball.sha256 ]]; then
    python=$REPO/.venv/bin/python
    [[ -x $python ]] || python=python3
    tarball=$("$python" -c 'import sys; from pathlib import Path
from lab.images.rootfs import ensure_tarball
print(ensure_tarball(Path(sys.argv[1])))' "$CACHE_DIR")
fi

root=$(mktemp -d /var/tmp/fleet-fresh-root.XXXXXX)
log=$root.log
mounted=()

mounted_under_root() { findmnt -rn -o TARGET | awk -v r="$root" '$0 == r || index($0, r "/") == 1' || true; }

cleanup() {
    local status=$? target i
    trap - EXIT INT TERM
    for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do
        umount "${mounted[i]}" 2>/dev/null || umount -l "${mounted[i]}" || true
    done
    # Never delete through a mount (a bound /dev or /opt/wheels): check, and stay on one
    # file system even so.
    for target in $(mounted_under_root | sort -r); do umount -l "$target" || true; done
    if [[ -n $(mounted_under_root) ]]; then
        echo "fresh-root-check: still mounted under $root, not removing it:" >&2
        mounted_under_root >&2
        exit 1
    fi
    rm -rf --one-file-system "$root" "$log"
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

bind_into_root() {  # bind_into_root SRC [ro]: mount SRC at the same path inside the root
    local src=$1 dst=$root$1
    if [[ -d $src ]]; then mkdir -p "$dst"; else mkdir -p "$(dirname "$dst")" && : >"$dst"; fi
    mount --bind "$src" "$dst"
    mounted+=("$dst")
    if [[ ${2:-} == ro ]]; then mount -o remount,bind,ro "$dst"; fi
}

tar --numeric-owner -xpf "$tarball" -C "$root"
echo "fresh root: $root from $(basename "$tarball")"

mount -t proc proc "$root/proc" && mounted+=("$root/proc")
mount -t sysfs -o ro sysfs "$root/sys" && mounted+=("$root/sys")
bind_into_root /dev
bind_into_root /dev/pts

cp -L /etc/resolv.conf "$root/etc/resolv.conf"
for conf in /etc/apt/apt.conf.d/*; do
    [[ -e $root$conf ]] || cp "$conf" "$root$conf"
done
# CAs this machine trusts beyond Debian's (a TLS-inspecting proxy before PyPI): added to the
# root the way an administrator adds a local CA, so a later ca-certificates run keeps them.
python3 - "$root" <<'PY'
import re, sys
from pathlib import Path
pem = re.compile(r"-----BEGIN CERTIFICATE-----.+?-----END CERTIFICATE-----", re.S)
bundle = "etc/ssl/certs/ca-certificates.crt"
ours = set(pem.findall(Path("/", bundle).read_text()))
theirs = set(pem.findall(Path(sys.argv[1], bundle).read_text()))
local = Path(sys.argv[1], "usr/local/share/ca-certificates")
for n, cert in enumerate(sorted(ours - theirs)):
    (local / f"fleet-host-{n}.crt").write_text(cert + "\n")
print(f"host CAs added to the root: {len(ours - theirs)}")
PY
chroot "$root" update-ca-certificates >/dev/null 2>&1
printf '#!/bin/sh\nexit 101\n' >"$root/usr/sbin/policy-rc.d"
chmod 0755 "$root/usr/sbin/policy-rc.d"

# pip's configuration, and the local directories it points at.
pip_env=()
pip_texts=""
for conf in /etc/pip.conf /etc/xdg/pip/pip.conf "$HOME/.config/pip/pip.conf" "$HOME/.pip/pip.conf"; do
    [[ -f $conf ]] || continue
    dest=$root${conf/#$HOME//root}
    mkdir -p "$(dirname "$dest")" && cp "$conf" "$dest"
    pip_texts+=$'\n'$(cat "$conf")
done
while IFS='=' read -r name value; do
    pip_env+=("$name=$value")
    pip_texts+=$'\n'$value
done < <(env | grep -E '^PIP_[A-Z_]+=' || true)
declare -A bound=()
for dir in $(grep -oE '(file://)?/[^[:space:]]+' <<<"$pip_texts" | sed 's#^file://##' | sort -u); do
    # A file it names (constraints) is copied, unless the root has its own (the CA bundle);
    # an index is a directory, and a PEP 503 `.../simple/` tree links its files relative to
    # its parent (../../files/...).
    if [[ -f $dir ]]; then
        [[ -e $root$dir ]] || { mkdir -p "$(dirname "$root$dir")" && cp "$dir" "$root$dir"; }
        continue
    fi
    [[ -d $dir ]] || continue
    dir=$(realpath "$dir")
    [[ $(basename "$dir") == simple ]] && dir=$(dirname "$dir")
    case $dir in / | /etc* | /usr* | /dev* | /proc* | /sys* | /root* | /home*) continue ;; esac
    [[ -n ${bound[$dir]:-} ]] && continue
    bound[$dir]=1
    bind_into_root "$dir" ro
done
echo "pip configuration: ${!bound[*]} bound read-only; ${#pip_env[@]} PIP_* variables"

# The repository as a clone has it (tracked and new files; no .lab/, .venv/ or caches), with
# the set-up under test in place of its own.
copy=$root/root/fleet-reconciler
mkdir -p "$copy"
git -C "$REPO" ls-files -z --cached --others --exclude-standard |
    while IFS= read -r -d '' name; do  # a file deleted in the working tree is still listed
        if [[ -f $REPO/$name ]]; then printf '%s\0' "$name"; fi
    done | (cd "$REPO" && xargs -0 cp --parents -t "$copy")
install -m 0755 "$setup" "$copy/.ci/setup-machine.sh"
in_root() {
    # FLEET_SETUP_SKIP_TEST_TOOLS: Chromium and promtool (only tests use them) are no part of the lab's
    # set-up and would double this check's downloads; setup-machine.sh installs it apart.
    chroot "$root" /usr/bin/env -i HOME=/root LANG=C.UTF-8 TERM=dumb FLEET_SETUP_SKIP_TEST_TOOLS=1 \
        PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "${pip_env[@]}" \
        bash -c 'cd /root/fleet-reconciler && "$@"' in_root "$@"
}

echo "--- first run of scripts/setup.sh (.ci/setup-machine.sh, then the project's venv)"
first=$SECONDS
# apt's and dpkg's few hundred lines go to a log, shown when the run fails.
if ! in_root bash scripts/setup.sh >"$log" 2>&1; then
    tail -n 80 "$log" >&2
    echo "fresh-root-check: the first run of scripts/setup.sh failed" >&2
    exit 1
fi
echo "$(grep -c '^Setting up' "$log") Debian packages set up"
grep -E '^(lobes [0-9]|fleet lab machine setup)' "$log"
echo "first run: $((SECONDS - first)) s"
echo "--- second run of .ci/setup-machine.sh (must install nothing)"
# What a run that installs something changes: dpkg's database, a venv, the plugin.
changed() { stat -c '%n %Y %s' "$root/var/lib/dpkg/status" "$root/opt/fleet-lab/"*/pyvenv.cfg \
                "$root/usr/local/lib/docker/cli-plugins/docker-compose"; }
before=$(changed)
second=$SECONDS
in_root bash .ci/setup-machine.sh
if [[ $(changed) != "$before" ]]; then
    echo "fresh-root-check: the second run changed the root:" >&2
    diff <(echo "$before") <(changed) >&2 || true
    exit 1
fi
echo "second run: $((SECONDS - second)) s, nothing changed"

echo "--- checks inside the fresh root"
in_root docker compose version
in_root /opt/fleet-lab/lobes-venv/bin/lobes --version
# The lab's box users are unprivileged: both must work for any user.
chroot --userspec=nobody:nogroup "$root" /usr/bin/env -i HOME=/tmp PATH=/usr/bin:/bin \
    docker compose version >/dev/null
chroot --userspec=nobody:nogroup "$root" /usr/bin/env -i HOME=/tmp PATH=/usr/bin:/bin \
    /opt/fleet-lab/lobes-venv/bin/lobes --version >/dev/null
in_root .venv/bin/reconcile --version
# The README's offline replay, where no lab ever ran: the weakest link, exit 2 (a finding).
replay=0
in_root .venv/bin/reconcile -i lab audit --from-snapshot \
    tests/fixtures/audit/weakest_link_proven_live >"$log" 2>&1 || replay=$?
tail -n 1 "$log"
if [[ $replay != 2 ]] || grep -q Traceback "$log"; then
    cat "$log" >&2
    echo "fresh-root-check: the README's offline audit replay exited $replay, not 2" >&2
    exit 1
fi
echo "fresh-root-check: ok in $((SECONDS - started)) s"
