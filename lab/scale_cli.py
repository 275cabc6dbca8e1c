"""`python -m lab scale up|down|status`: the command side of lab/scale.py."""

from __future__ import annotations

import json
import os
import sys

from .proc import LabError


def main(action: str, count: int) -> int:
    from . import scale

    if os.geteuid() != 0 and action != "status":
        print("lab scale up/down need root (namespaces, users, daemons)", file=sys.stderr)
        return 1
    try:
        if action == "up":
            scale.up(count)
        elif action == "down":
            scale.down()
        report = scale.status()
    except LabError as e:
        print(f"lab: {e}", file=sys.stderr)
        return 1
    if action == "status" or action == "up":
        for name, row in report.items():
            states = ", ".join(f"{n} {s}" for s, n in sorted(dict(row["containers"]).items()))
            sshd = "sshd up" if row["sshd"] else "sshd DOWN"
            print(
                f"{name:<10} {row['address']:<12} {row['user']:<14} engine {row['engine']:<6}"
                f" {sshd:<9} {states or 'no containers'}"
            )
        print(json.dumps({"boxes": len(report), "ready": scale.ready(report)}))
        return 0 if scale.ready(report) else 3
    return 0
