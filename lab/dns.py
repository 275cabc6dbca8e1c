"""A resolver on the lab bridge that knows the boxes and fails everything else at once.

Without it every box engine forwards names its embedded DNS does not know (a lane a shape
dropped, `vllm-primary` on thor; anything external) to the host's nameserver, which a box
cannot route to: each such lookup then hangs for 10 s, which made a gateway take 20 s to
boot. dnsmasq answers the box names and NXDOMAIN for the rest, with no upstream at all, so
no lookup ever leaves 10.77.0.0/24.
"""

from __future__ import annotations

from .config import BOXES, BRIDGE_ADDR, LOG_DIR, RUN_ROOT
from .proc import Identity, LabError, log, read_pid, running, spawn, stop_pidfile, wait_for

BINARY = "/usr/sbin/dnsmasq"
PIDFILE = RUN_ROOT / "dnsmasq.pid"
ARGV_FILE = RUN_ROOT / "dnsmasq.argv"
SERVER = BRIDGE_ADDR
# What the pid in PIDFILE must be to count as ours (pids are reused; see proc.is_program).
_IDENTITY: Identity = {"program": BINARY, "argv_has": f"--pid-file={PIDFILE}"}


def argv() -> list[str]:
    records = [f"--host-record={b.name},{b.name}.lab,{b.address}" for b in BOXES]
    return [
        BINARY,
        "--keep-in-foreground",
        "--conf-file=/dev/null",  # not /etc/dnsmasq.conf: the host's, not ours
        "--no-resolv",
        "--no-hosts",
        "--no-poll",
        f"--listen-address={SERVER}",
        "--bind-interfaces",
        "--port=53",
        f"--pid-file={PIDFILE}",
        *records,
        "--address=/#/",  # every other name: NXDOMAIN, answered locally
    ]


def ensure() -> None:
    want = "\0".join(argv())
    if running(PIDFILE, **_IDENTITY) and ARGV_FILE.exists() and ARGV_FILE.read_text() == want:
        return
    stop_pidfile(PIDFILE, **_IDENTITY)
    RUN_ROOT.mkdir(parents=True, exist_ok=True)
    ARGV_FILE.write_text(want)
    log(f"dnsmasq {SERVER}:53")
    spawn(argv(), LOG_DIR / "dnsmasq.log")
    try:
        wait_for(lambda: running(PIDFILE, **_IDENTITY), timeout=10, what="dnsmasq")
    except LabError:
        raise LabError((LOG_DIR / "dnsmasq.log").read_text()[-1000:]) from None


def stop() -> None:
    if stop_pidfile(PIDFILE, **_IDENTITY):
        log("stopped dnsmasq")
    ARGV_FILE.unlink(missing_ok=True)


def pid() -> int | None:
    return read_pid(PIDFILE)
