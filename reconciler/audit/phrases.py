"""How evidence reads in a report: the few phrases every renderer and every finding shares.

A secret is never shown, only "set (digest a1b2c3…)": 6 hex of the report digest (SHA-256 over
the collector's per-run HMAC, `report.json_report.secret_digest`), enough to see at a glance
that two places hold the same value within one run and nothing more.
"""

from __future__ import annotations

from reconciler.audit.evidence import Carried, EnvLine, KeyedProbe, Probe
from reconciler.compare.drift import SecretValue
from reconciler.report.json_report import secret_digest

SHORT = 6


def short(secret: SecretValue) -> str:
    return secret_digest(secret)[:SHORT] + "…"


def digest(secret: SecretValue | None) -> str:
    return f"digest {short(secret)}" if secret is not None else "no value"


def env_line(line: EnvLine | None) -> str:
    """`set (digest a1b2c3…) at .env:1193`, `commented out at .env:839`, `absent`."""
    if line is None or line.state == "absent":
        return "absent"
    if line.state == "no-file":
        return "no .env"
    if line.state == "unknown":
        return "unknown (.env not read)"
    at = f" at .env:{line.line}" if line.line else ""
    if line.state == "set":
        return f"set ({digest(line.digest)}){at}"
    if line.state == "commented-out":
        value = f" ({digest(line.digest)})" if line.digest else ""
        return f"commented out{value}{at}"
    return f"empty{at}"


def carried(c: Carried | None) -> str:
    """`set (digest a1b2c3…) from ~/.bashrc:7`, `empty`."""
    if c is None:
        return "unknown"
    if c.digest is None:
        return "empty" + (" (.env and login shell agree)" if c.origin == "none" else "")
    return f"set ({digest(c.digest)}) {origin(c)}"


def origin(c: Carried) -> str:
    if c.origin == "env":
        return f"from {c.where}"
    if c.origin == "shell":
        return f"from the login shell {c.where}"
    if c.origin == "env+shell":
        return f"from {c.where} (the login shell exports the same)"
    if c.origin == "unexplained":
        return "from neither .env nor the login shell"
    if c.origin == "unknown":
        shell = f"; the login shell exports the same at {c.where}" if c.where else ""
        return f"from an unknown source (.env not read{shell})"
    return ""


def status(probe: Probe | KeyedProbe | None) -> str:
    if probe is None or probe.status is None:
        return "-"
    return str(probe.status)


def same_as(names: list[str]) -> str:
    return "same as " + ", ".join(names)
