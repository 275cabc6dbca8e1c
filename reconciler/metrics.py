"""`--metrics FILE`: the run as Prometheus text exposition, for node_exporter's textfile
collector, written atomically (prometheus_client writes a temporary file beside it and renames
it, so the collector never reads half a file).

Labels stay bounded: `box` (the inventory's names), `kind` (the drift kinds), `verdict`
(ok/warn/fail), never a value. Drift and audit write different metric names, so each command
gets its own file (drift.prom, audit.prom) in the textfile directory. Built from the reports'
JSON documents, the same public form the history records; prometheus_client is imported here
only, when --metrics is given.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

VERDICTS = ("ok", "warn", "fail")


def drift_registry(
    doc: dict[str, Any],
    kinds: tuple[str, ...],
    finished: float,
    duration_s: float,
    collect_s: dict[str, float] | None = None,
    faults: Mapping[str, Sequence[str]] | None = None,
) -> CollectorRegistry:
    """A drift report document -> its metrics. `kinds`: every drift kind, so a box observed
    in full without drift of a kind reads 0 (not absent: an alert on `> 0` needs the zero to
    resolve). `collect_s`: how long each box's collector ran on the box (its own
    `timings_ms.total`). `faults`: each box's fault parts (history/parts.py); a box without
    has them read from its errors' texts (parts.known); for one whose text names no part, no
    part is said observed (a gauge cannot say "compared as recorded"), its entries counted.

    Which parts of the box were observed is `fleet_drift_box_part_observed` (part: lanes,
    gateway, box-wide, as the history and the HTML matrix name them): dockerd down leaves the
    lanes and the gateway unseen, a login-shell timeout only the box-wide part, which apply
    tolerates; the alerts tell them apart (FleetBoxNotObserved, FleetBoxPartNotObserved).

    A box not observed in full (unreachable, or a fault left part of it unseen) has no 0
    written: its zero is not known, and an alert must not resolve on it. The kinds it was
    found drifting in are written (a lower bound), and `fleet_drift_box_observed` is 0. Every
    entry is counted, in a part with a fault too: compare makes none where it could not look
    (dockerd down says no lane is missing), so what a faulted part still showed (the
    controller's probes of a gateway whose /health timed out) is drift found."""
    from prometheus_client import CollectorRegistry, Gauge

    from reconciler.history.parts import (
        BOX_WIDE,
        EVERY,
        GATEWAY,
        LANES,
        NOT_RECORDED,
        known,
        unseen_columns,
    )

    registry = CollectorRegistry()
    _box_times(registry, "drift", [b["box"] for b in doc["boxes"]], finished, collect_s or {})
    reachable = Gauge(
        "fleet_drift_box_reachable",
        "1 if the box was observed over SSH in the last drift run, else 0",
        ["box"],
        registry=registry,
    )
    observed = Gauge(
        "fleet_drift_box_observed",
        "1 if every part of the box was observed in the last drift run (its entry counts are "
        "whole), else 0 (unreachable, dockerd down, a gateway probe unanswered, ...)",
        ["box"],
        registry=registry,
    )
    part_observed = Gauge(
        "fleet_drift_box_part_observed",
        "1 if the part of the box (lanes: its lanes' containers; gateway; box-wide: the login "
        "shell, .env secret sources, files) was observed in the last drift run, else 0 "
        "(dockerd down: lanes and gateway; a login-shell timeout: box-wide; unreachable: all)",
        ["box", "part"],
        registry=registry,
    )
    entries = Gauge(
        "fleet_drift_entries",
        "drift entries of the box by kind in the last drift run (a box not observed in full: "
        "only the kinds found, a lower bound; no 0 is written for it)",
        ["box", "kind"],
        registry=registry,
    )
    causes = Gauge(
        "fleet_drift_causes",
        "distinct causes of the box's drift in the last drift run (not written as 0 for a box "
        "not observed in full)",
        ["box"],
        registry=registry,
    )
    errors = Gauge(
        "fleet_drift_observation_errors",
        "faults observing the box in the last drift run (unreachable, dockerd down, ...)",
        ["box"],
        registry=registry,
    )
    given = faults or {}
    for box in doc["boxes"]:
        name = box["box"]
        reachable.labels(name).set(1 if box["reachable"] else 0)
        seen = box.get("observation") or ("full" if box["reachable"] else "none")
        parts = known(len(box["errors"]), given.get(name), box["errors"])
        unseen = unseen_columns(parts)
        # Seen, as far as is known: a fault naming no part may have left any part unseen.
        seen_parts = set() if seen != "full" or NOT_RECORDED in parts else EVERY - unseen
        whole = seen_parts == EVERY
        observed.labels(name).set(1 if whole else 0)
        for part in (LANES, GATEWAY, BOX_WIDE):
            part_observed.labels(name, part).set(1 if part in seen_parts else 0)
        # Every entry is drift the run saw, in a part with a fault too (a gateway answering
        # without a key to the controller's probes while its /health timed out): compare
        # makes none where it could not look (dockerd down: no "no container" lanes).
        drifts = box["drifts"]
        for kind in dict.fromkeys([*(kinds if whole else ()), *(d["kind"] for d in drifts)]):
            entries.labels(name, kind).set(sum(1 for d in drifts if d["kind"] == kind))
        if whole or drifts:
            causes.labels(name).set(len({d["cause"] for d in drifts}))
        errors.labels(name).set(len(box["errors"]))
    _run_metrics(registry, "drift", doc, finished, duration_s)
    return registry


def audit_registry(
    doc: dict[str, Any],
    finished: float,
    duration_s: float,
    collect_s: dict[str, float] | None = None,
) -> CollectorRegistry:
    """An audit report document -> its metrics; each verdict is a labelled 0/1 gauge (one
    series per verdict, the one that holds is 1), the mesh's in its own metric."""
    from prometheus_client import CollectorRegistry, Gauge

    registry = CollectorRegistry()
    _box_times(registry, "audit", [b["box"] for b in doc["boxes"]], finished, collect_s or {})
    verdict = Gauge(
        "fleet_audit_verdict",
        "1 for the box's audit verdict (ok, warn, fail) in the last audit run, 0 for the others",
        ["box", "verdict"],
        registry=registry,
    )
    mesh = Gauge(
        "fleet_audit_mesh_verdict",
        "1 for the mesh's audit verdict (ok, warn, fail) in the last audit run",
        ["verdict"],
        registry=registry,
    )
    reachable = Gauge(
        "fleet_audit_box_reachable",
        "1 if the box answered over SSH in the last audit run (its answer read in full, even "
        "when its gateway answered nothing), else 0",
        ["box"],
        registry=registry,
    )
    findings = Gauge(
        "fleet_audit_findings",
        "findings of the box in the last audit run",
        ["box"],
        registry=registry,
    )
    errors = Gauge(
        "fleet_audit_observation_errors",
        "faults observing the box in the last audit run",
        ["box"],
        registry=registry,
    )
    for box in doc["boxes"]:
        name = box["box"]
        for v in VERDICTS:
            verdict.labels(name, v).set(1 if box["verdict"] == v else 0)
        reachable.labels(name).set(1 if box.get("observation") == "full" else 0)
        findings.labels(name).set(len(box["findings"]))
        errors.labels(name).set(len(box["errors"]))
    for v in VERDICTS:
        mesh.labels(v).set(1 if doc["mesh"]["verdict"] == v else 0)
    _run_metrics(registry, "audit", doc, finished, duration_s)
    return registry


def _box_times(
    registry: CollectorRegistry,
    command: str,
    boxes: list[str],
    finished: float,
    collect_s: dict[str, float],
) -> None:
    """Per box: when the run that covered it finished (a run of some boxes writes only theirs),
    and how long its collector ran on it (absent for a box that gave no answer)."""
    from prometheus_client import Gauge

    stamp = Gauge(
        f"fleet_{command}_box_last_run_timestamp_seconds",
        f"when the last {command} run that covered the box finished (Unix time)",
        ["box"],
        registry=registry,
    )
    took = Gauge(
        f"fleet_{command}_box_collect_duration_seconds",
        f"how long the collector ran on the box in the last {command} run",
        ["box"],
        registry=registry,
    )
    for box in boxes:
        stamp.labels(box).set(finished)
        if box in collect_s:
            took.labels(box).set(collect_s[box])


def collector_seconds(obs: Any) -> float | None:
    """A box's collector time from its observation (snapshot box-file form), if it has one."""
    collected = obs.get("collected") if isinstance(obs, dict) else None
    timings = collected.get("timings_ms") if isinstance(collected, dict) else None
    total = timings.get("total") if isinstance(timings, dict) else None
    if isinstance(total, int | float) and not isinstance(total, bool):
        try:
            seconds = float(total) / 1000
        except OverflowError:  # an integer past a float's range
            return None
        if math.isfinite(seconds) and seconds >= 0:  # never +Inf or NaN on a dashboard
            return seconds
    return None


def snapshot_time(directory: Path) -> float:
    """When a snapshot's observations were made: its index's `taken_at` (UTC, written when
    the run that saved it began), else when its index was written (an index without one, or
    with one that is no time). What a replay's metrics are stamped with (hooks._finished)."""
    from datetime import UTC, datetime

    from reconciler.observe.observe import snapshot_index

    index = directory / "index.json"
    try:
        taken = snapshot_index(directory).get("taken_at")
        if isinstance(taken, str):
            return datetime.strptime(taken, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()
    except (OSError, ValueError):
        pass  # the replay said what was wrong with it
    try:
        return index.stat().st_mtime
    except OSError:
        import time

        return time.time()  # gone since the replay read it: no better time is known


def _run_metrics(
    registry: CollectorRegistry, command: str, doc: dict[str, Any], finished: float, took: float
) -> None:
    from prometheus_client import Gauge

    Gauge(
        f"fleet_{command}_last_run_timestamp_seconds",
        f"when the last {command} run finished (Unix time)",
        registry=registry,
    ).set(finished)
    Gauge(
        f"fleet_{command}_last_run_duration_seconds",
        f"how long the last {command} run took",
        registry=registry,
    ).set(took)
    Gauge(
        f"fleet_{command}_last_run_exit_code",
        f"the last {command} run's exit code (0 ok, 2 findings, 1 a box not handled)",
        registry=registry,
    ).set(int(doc["summary"]["exit_code"]))


def write(path: Path, registry: CollectorRegistry) -> None:
    """Atomically: a temporary file in the same directory, then a rename over `path`, as
    node_exporter's textfile collector needs (reconciler/output_file.py: never over a device
    or a symlink, which prometheus_client's own write_to_textfile would replace)."""
    from prometheus_client import generate_latest

    from reconciler.output_file import write_whole

    write_whole(path, [generate_latest(registry).decode("utf-8")])
