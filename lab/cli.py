"""`python -m lab up|down|status|ssh BOX|incident NAME BOX ...` (the lead wires `reconcile lab`)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from . import incidents, lifecycle, ssh, statustable
from .config import box
from .proc import LabError


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m lab", description="the three-box fleet lab")
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("up", help="build or restore the lab; returns when every lane is healthy")
    down = sub.add_parser("down", help="remove everything `up` created")
    down.add_argument("--purge", action="store_true", help="also drop the image cache")
    sub.add_parser("status", help="table of boxes, lanes and health")
    s = sub.add_parser("ssh", help="log in to a box as its user (or run a command there)")
    s.add_argument("box")
    s.add_argument("command", nargs=argparse.REMAINDER)
    inc = sub.add_parser("incident", help="reproduce a field incident by hand on a box")
    inc.add_argument("name", choices=sorted(incidents.INCIDENTS))
    inc.add_argument("box")
    inc.add_argument("args", nargs=argparse.REMAINDER)
    r = sub.add_parser("reset", help="put one box back to its pristine deployment")
    r.add_argument("box")
    sc = sub.add_parser("scale", help="N more SSH boxes sharing the lab's engines (lab/scale.py)")
    sc.add_argument("action", choices=("up", "down", "status"))
    sc.add_argument("--boxes", type=int, default=50, help="how many boxes `up` makes (50)")
    ns = p.parse_args(argv)
    if ns.cmd == "scale":
        from .scale_cli import main as scale_main

        return scale_main(ns.action, ns.boxes)
    if os.geteuid() != 0 and ns.cmd in ("up", "down", "reset"):
        print("lab up/down need root (namespaces, users, daemons)", file=sys.stderr)
        return 1
    try:
        if ns.cmd == "up":
            t0 = time.monotonic()
            data = lifecycle.up()
            print(f"lab up ({data['timings']['last_up_kind']}): {time.monotonic() - t0:.1f}s")
        elif ns.cmd == "down":
            lifecycle.down(purge=ns.purge)
        elif ns.cmd == "status":
            report = statustable.status()
            return 0 if all(h.ready for h in report.values()) else 3
        elif ns.cmd == "ssh":
            b = box(ns.box)
            cmd = " ".join(ns.command) if ns.command else None
            argv_ = ssh.argv(b, cmd, tty=cmd is None and sys.stdin.isatty())
            os.execvp(argv_[0], argv_)
        elif ns.cmd == "incident":
            result = incidents.INCIDENTS[ns.name](ns.box, *ns.args)
            print(json.dumps(result, indent=1))
        elif ns.cmd == "reset":
            print(json.dumps(incidents.reset(ns.box), indent=1))
    except LabError as e:
        print(f"lab: {e}", file=sys.stderr)
        return 1
    except subprocess.TimeoutExpired as e:  # a step's own deadline (proc.run): said, not a trace
        cmd = e.cmd if isinstance(e.cmd, str) else " ".join(map(str, e.cmd))
        print(f"lab: {cmd[:300]}: no answer in {e.timeout:g}s", file=sys.stderr)
        return 1
    except RuntimeError as e:  # an image build step (DockerError, pip, debootstrap) that failed
        print(f"lab: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    return 0
