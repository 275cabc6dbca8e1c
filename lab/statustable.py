"""`lab status`: one rich table of boxes, lanes and health, from live probes (never from files)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from . import dns, engines, readiness, registry
from .config import BOXES, BUILDER, REGISTRY
from .proc import running


def _mark(ok: bool) -> str:
    return "[green]up[/]" if ok else "[red]down[/]"


def status(console: Console | None = None) -> dict[str, readiness.BoxHealth]:
    """Print the table and return the per-box health (ready == no problems)."""
    console = console or Console()
    report: dict[str, readiness.BoxHealth] = {}
    table = Table(title=f"fleet lab  (registry {REGISTRY}: {_mark(registry.healthy())}, "
                        f"dns: {_mark(running(dns.PIDFILE))}, "
                        f"builder: {_mark(running(BUILDER.dockerd_pidfile))})")  # fmt: skip
    for col in (
        "box",
        "address",
        "sshd",
        "dockerd",
        "lane",
        "container",
        "health",
        "gateway",
        "roles ready",
    ):
        table.add_column(col)
    for box in BOXES:
        sshd_up = running(box.sshd_pidfile)
        engine_up = running(box.dockerd_pidfile) and engines.responds(box)
        if engine_up:
            h = readiness.check(box)
        else:
            h = readiness.BoxHealth(box=box.name, problems=["dockerd down"])
        report[box.name] = h
        ready_roles = sorted(r for r, info in h.roles.items() if info.get("ready"))
        roles = (
            ", ".join(f"{r}{'*' if h.roles[r].get('proxied') else ''}" for r in ready_roles) or "-"
        )
        gw = h.gateway_version or "[red]no answer[/]"
        lanes = h.lanes or [readiness.Lane("-", "-", "-", "-", "-")]
        for i, lane in enumerate(lanes):
            colour = (
                "green"
                if lane.health == "healthy"
                else "yellow"
                if lane.health == "starting"
                else "red"
            )
            first = i == 0
            table.add_row(
                box.name if first else "",
                box.address if first else "",
                _mark(sshd_up) if first else "",
                _mark(engine_up) if first else "",
                lane.service,
                lane.container,
                f"[{colour}]{lane.state}/{lane.health}[/]",
                gw if first else "",
                roles if first else "",
                end_section=i == len(lanes) - 1,
            )
    console.print(table)
    console.print("roles marked * are served by another box through the mesh")
    for name, h in report.items():
        if h.problems:
            console.print(f"[red]{name}[/]: " + "; ".join(h.problems))
    return report
