"""What `drift` and `audit` do after printing their report: `--metrics FILE` and the history.

Imported when the parser is built, so stdlib only at module level; sqlite3, prometheus_client
and the report document are imported after the report is out. Paths are checked before any
box is contacted (a bad one is exit 1 with nothing observed); a history that cannot be written
once the run is done is a warning, never the run's exit code (the report was printed).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from reconciler.arg_types import file_path

EXIT_ERROR = 1


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """--history / --no-history / --metrics on a command that records its runs."""
    parser.add_argument(
        "--metrics",
        metavar="FILE",
        type=file_path,
        help="also write Prometheus metrics to FILE (atomically; for node_exporter's textfile "
        "collector)",
    )
    # Both given, the store named was silently not written: one or the other.
    recording = parser.add_mutually_exclusive_group()
    recording.add_argument(
        "--history",
        metavar="PATH",
        type=file_path,
        help="record the run in this SQLite store (default: $XDG_STATE_HOME/fleet-reconciler/"
        "history.sqlite3; a replay --from-snapshot is recorded only with --history)",
    )
    recording.add_argument("--no-history", action="store_true", help="do not record this run")


class RunOutputs:
    """Where a run's metrics and history go, and when it started. (A plain class: no
    dataclass before the collectors are spawned, observe/transport.py says why.)"""

    def __init__(self, history: Path | None, metrics: Path | None, root: str | None = None) -> None:
        self.history = history  # None: not recorded
        self.metrics = metrics
        # The fleet repository the run judges (_fleet_root): the drift page's sparklines are
        # this fleet's runs only (history/series.py), as a recorded run names it.
        self.root = root
        self.started = time.time()  # wall clock, for the record
        self.clock = time.monotonic()  # for the duration


def prepare(args: argparse.Namespace) -> RunOutputs | None:
    """The run's outputs, checked; None (after printing why) when one cannot be used."""
    from reconciler.history.location import HistoryLocationError, history_path
    from reconciler.output_file import target_problem

    wanted = [("-o", getattr(args, "output", None)), ("--metrics", args.metrics)]
    for option, path in wanted:
        problem = target_problem(option, path) if path else None
        if problem:
            print(f"error: {problem}", file=sys.stderr)
            return None
    problem = _observing_problem(args)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return None
    history = None
    if not args.no_history and (args.history or not getattr(args, "from_snapshot", None)):
        try:
            history = history_path(args.history, _repo_root(args))
        except HistoryLocationError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return None
        problem = _foreign_store(history) if args.history else None
        if problem:
            print(f"error: {problem}", file=sys.stderr)
            return None
    problem = _one_file_twice(wanted, history)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return None
    root = _fleet_root(args) if history is not None else None  # only the page's trend reads it
    return RunOutputs(history, Path(args.metrics) if args.metrics else None, root)


# The files SQLite keeps beside a store: replaced by a report, the store's last runs are lost.
_STORE_FILES = ("", "-wal", "-shm", "-journal")


def _one_file_twice(wanted: list[tuple[str, str | None]], history: Path | None) -> str | None:
    """Why two of the run's outputs (`-o`, `--metrics`, the history store) would be one file:
    each is replaced whole by a file renamed over it (output_file.py), so the report would
    take the store's place (the history lost, the run recorded into the report) or the
    metrics the report's. Said before any box is observed. Not a file here: a descriptor the
    run was given (`-o /dev/stdout`), a device or a FIFO (written into, never replaced)."""
    from reconciler.output_file import descriptor

    outputs = [
        (f"{option} {path}", path)
        for option, path in wanted
        if path and descriptor(path) is None and _replaced(path)
    ]
    for i, (what, path) in enumerate(outputs):
        for other, other_path in outputs[:i]:
            if _same_file(path, other_path):
                return (
                    f"{other} and {what} are one file: the output written last would replace "
                    "the other; give each its own file"
                )
        if history is not None and any(_same_file(path, f"{history}{e}") for e in _STORE_FILES):
            return (
                f"{what} is a file of the history store {history}: the output would replace "
                "it, and the runs it holds be lost; give another file, or another --history"
            )
    return None


def _replaced(path: str) -> bool:
    """A path an output is renamed onto: a regular file, or nothing yet."""
    import stat

    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:  # none yet (or not to be looked at: target_problem said so)
        return True


def _same_file(a: str, b: str) -> bool:
    """One file by its path (links resolved) or, both there, by its inode (a hard link)."""
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them is not there yet
        return False


def _foreign_store(path: Path) -> str | None:
    """Why the store a run was pointed at (`--history PATH`) would refuse its record, when
    that is known before the run: another application's database, not a database at all, a
    newer reconciler's store. Found once every box was observed, it was a warning and exit 2,
    which a timer counts as a success: it never recorded. Only for a path given: the default
    store is this tool's own, and opening it costs a live run's critical path ~4 ms."""
    from reconciler.history.store import HistoryError, reading

    try:
        if not path.is_file():
            return None  # a new store: made when the run is recorded
        with reading(path):
            return None
    except HistoryError as exc:
        return str(exc)
    except OSError:  # not permitted to look: the record says it
        return None


def _observing_problem(args: argparse.Namespace) -> str | None:
    """A live run's settings that would fail only once boxes are contacted: the fan-out's
    environment ($FLEET_MAX_PARALLEL, $FLEET_BOX_TIMEOUT: a traceback, or an error after the
    collectors started) and `--save-snapshot DIR` (refused after every box was observed)."""
    if getattr(args, "from_snapshot", None) is None:
        from reconciler.observe.fanout import settings_problem

        problem = settings_problem()
        if problem:
            return problem
    saving = getattr(args, "save_snapshot", None)
    if saving:
        from reconciler.observe.observe import (
            INDEX_BOX,
            index_box_problem,
            snapshot_target_problem,
        )

        if INDEX_BOX in _boxes_to_save(args):
            return f"--save-snapshot {saving}: {index_box_problem()}"
        return snapshot_target_problem(saving)
    return None


def _boxes_to_save(args: argparse.Namespace) -> list[str]:
    """The boxes a saving run will save, as far as they are known before the desired state is
    read: the boxes named, or those of the snapshot replayed (`--from-snapshot`). A whole
    inventory's are known only once it is read: a box of it named `index` is refused by the
    save (observe.save_snapshot), after the boxes were observed."""
    named = list(getattr(args, "boxes", None) or [])
    source = getattr(args, "from_snapshot", None)
    if named or not source:
        return named
    from reconciler.observe.observe import snapshot_index

    try:
        boxes = snapshot_index(Path(source))["boxes"]
    except (OSError, ValueError):  # the run says what is wrong with it
        return []
    return [str(box) for box in boxes]


def _repo_root(args: argparse.Namespace) -> Path | None:
    from reconciler.desired.locate import root_or_none

    return Path(os.path.realpath(args.root)) if args.root else root_or_none()


def preload(outs: RunOutputs) -> None:
    """Import what finish_drift will use, while the boxes are still working: after their
    answers these imports would be on the run's critical path (about 10 ms of CPU)."""
    from importlib import import_module

    wanted = ["reconciler.report.json_report"] if outs.metrics or outs.history else []
    if outs.history is not None:
        wanted += ["reconciler.history.record", "reconciler.history.store"]  # and sqlite3
    for name in wanted:
        import_module(name)


def finish_drift(
    outs: RunOutputs,
    args: argparse.Namespace,
    run: Any,
    exit_code: int,
    printed_json: Iterable[str] | None = None,
) -> int:
    """After the drift report is printed: metrics, then the history. `run`: a DriftRun, or a
    large replay's PartsReport, whose workers made each box's share of both (kept_parts.py),
    with `printed_json`, its JSON report as printed."""
    if outs.history is None and outs.metrics is None:
        return exit_code
    sys.stdout.flush()  # the report is out before anything here costs time
    if printed_json is not None:
        return _finish_parts(outs, args, run, exit_code, printed_json)
    from reconciler.history.parts import faults_of
    from reconciler.report.json_report import to_document

    doc = to_document(run.report)
    took = time.monotonic() - outs.clock
    kept = getattr(run, "observations", None) or {}
    seconds, observations = _observations(kept, args, doc, outs.history)
    # Which part of each box a fault is about: the document's errors are text only.
    faults = {b.box: faults_of(b.errors) for b in run.report.boxes}
    exit_code = _drift_metrics(outs, args, doc, took, seconds, exit_code, faults)
    if outs.history is not None:
        from reconciler.history.record import drift_record

        _record_run(outs, args, drift_record, doc, observations, took, faults=faults)
    return exit_code


def _finish_parts(
    outs: RunOutputs, args: argparse.Namespace, run: Any, exit_code: int, printed: Iterable[str]
) -> int:
    """`finish_drift` of a replay kept as its boxes' parts: the document is never built whole
    here, each box's rows, counts and packed observation came from its worker."""
    from reconciler.history.kept_parts import metrics_document, report_text
    from reconciler.report.json_parts import parts_head

    head = parts_head(run)
    took = time.monotonic() - outs.clock
    seconds = {k.row.box: k.seconds for k in run.kept if k.seconds is not None}
    faults = {k.row.box: k.row.faults or () for k in run.kept}
    document = metrics_document(head, run)
    exit_code = _drift_metrics(outs, args, document, took, seconds, exit_code, faults)
    if outs.history is not None:
        from reconciler.history.record import drift_record
        from reconciler.history.store import Packed

        record = drift_record(
            head,
            {k.row.box: Packed(k.observation) for k in run.kept if k.observation is not None},
            source=_source(args),
            started=outs.started,
            duration_s=took,
            root=_fleet_root(args),
            rows=[(k.row, k.entries) for k in run.kept],
            report=report_text(printed),
            entries=run.rows,  # the entries' rows, when kept aside (history/kept_parts.py)
        )
        _record(outs.history, record)
    return exit_code


def _drift_metrics(
    outs: RunOutputs,
    args: argparse.Namespace,
    doc: dict[str, Any],
    took: float,
    seconds: dict[str, float],
    code: int,
    faults: dict[str, tuple[str, ...]],
) -> int:
    """`--metrics`, if asked for, from the document (or what metrics_document keeps of it)."""
    if outs.metrics is None:
        return code
    from reconciler.compare.drift import Kind
    from reconciler.metrics import drift_registry

    kinds = tuple(k.value for k in Kind)
    registry = drift_registry(doc, kinds, _finished(args), took, seconds, faults)
    return code if _write_metrics(outs.metrics, registry) else EXIT_ERROR


def _finished(args: argparse.Namespace) -> float:
    """The time the metrics stamp the run with: now, or for a replay when its snapshot was
    taken. The metrics say how fresh the observations are (FleetDriftNotRunning, a
    dashboard's age): a week-old snapshot replayed today is a week old."""
    directory = getattr(args, "from_snapshot", None)
    if not directory:
        return time.time()
    from reconciler.metrics import snapshot_time

    return snapshot_time(Path(directory))


def finish_audit(
    outs: RunOutputs, args: argparse.Namespace, report: Any, observed: dict[str, Any], code: int
) -> int:
    """After the audit report is printed: metrics, then the history."""
    if outs.history is None and outs.metrics is None:
        return code
    sys.stdout.flush()
    from reconciler.audit.report_json import to_document

    doc = to_document(report)
    took = time.monotonic() - outs.clock
    seconds, observations = _observations(observed, args, doc, outs.history)
    if outs.metrics is not None:
        from reconciler.metrics import audit_registry

        registry = audit_registry(doc, _finished(args), took, seconds)
        if not _write_metrics(outs.metrics, registry):
            code = EXIT_ERROR
    if outs.history is not None:
        from reconciler.history.record import audit_record

        _record_run(outs, args, audit_record, doc, observations, took)
    return code


def _observations(
    observed: dict[str, Any], args: argparse.Namespace, doc: dict[str, Any], history: Path | None
) -> tuple[dict[str, float], dict[str, Any]]:
    """Each box's collector time (for the metrics) and, if the run is recorded (`history`),
    its observation as a snapshot's box file holds it (secrets hashed on the box).

    Only what the parser took: a kept observation holds no answer it refused (`collected` is
    None then), and a replay that kept none reads again only the files of the boxes its report
    (`doc`) judged observed in full (a file it refused, `1e400` read as inf, is neither a
    box's time nor its record)."""
    from reconciler.metrics import collector_seconds

    boxes = [b["box"] for b in doc["boxes"]]
    if observed:
        # The snapshot file's fields, by reference: records.asdict would deep-copy every
        # box's whole answer (~100 ms on the lab) only to serialise it.
        from reconciler.records import fields

        kept = {
            b: {f.name: getattr(observed[b], f.name) for f in fields(observed[b])}
            for b in boxes
            if b in observed
        }
        seconds = {b: s for b, obs in kept.items() if (s := collector_seconds(obs)) is not None}
        return seconds, kept if history is not None else {}
    directory = getattr(args, "from_snapshot", None)
    if not directory:
        return {}, {}
    full = [b["box"] for b in doc["boxes"] if b.get("observation") == "full"]
    return _replayed(Path(directory), full, history is not None)


def _replayed(
    directory: Path, boxes: list[str], stored: bool
) -> tuple[dict[str, float], dict[str, Any]]:
    """A replay that kept no observation reads them from its snapshot, a box at a time, each
    packed for the store as it is read (history/store.py): a 1,000-box replay then holds
    ~45 MB of packed files, not ~500 MB of parsed ones (its peak was 640 MB). `boxes`: those
    the report judged observed in full (the parser took their files); of them, only the ones
    the snapshot's index names, each file within the replay's bound: a file the replay refused
    is not kept, the report says why."""
    from reconciler.fast_json import LARGE
    from reconciler.history.store import pack
    from reconciler.metrics import collector_seconds
    from reconciler.observe.observe import snapshot_box_bytes, snapshot_index

    try:
        present = set(snapshot_index(directory)["boxes"])
    except (OSError, ValueError):
        return {}, {}  # changed since the replay read it: nothing of it is kept
    many = len(boxes) >= LARGE  # msgspec (C) reads and writes them, as the replay read them
    seconds: dict[str, float] = {}
    kept: dict[str, Any] = {}
    for box in boxes:
        if box not in present:
            continue
        try:
            obs, plain = decoded(snapshot_box_bytes(directory, box), many)
        except (OSError, ValueError):
            continue  # the report says what was wrong with that box's file
        total = collector_seconds(obs)
        if total is not None:
            seconds[box] = total
        if stored:
            kept[box] = pack(obs, plain)
    return seconds, kept


def decoded(data: bytes, many: bool) -> tuple[Any, bool]:
    """`json.loads` of the file's text (not UTF-8, or nested past json's depth: a ValueError),
    and whether msgspec read it: for `many` it does wherever it gives json's values
    (fast_json.decode_written; like json.loads without a hook, it keeps the last of a
    repeated key)."""
    from reconciler.fast_json import decode_written, loads_bytes

    if many:  # msgspec checks the UTF-8 itself: a file that is not goes to json, which refuses it
        try:
            return decode_written(data), True
        except ValueError:
            pass  # json's own reading, and its fault
    return loads_bytes(data), False


def _write_metrics(path: Path, registry: Any) -> bool:
    from reconciler.metrics import write

    try:
        write(path, registry)
    except OSError as exc:
        print(f"error: --metrics {path}: {exc.strerror or exc}", file=sys.stderr)
        return False
    return True


def _source(args: argparse.Namespace) -> str:
    """Where the run's observations came from: the boxes, or a saved snapshot (a replay)."""
    return "snapshot" if getattr(args, "from_snapshot", None) else "live"


def _fleet_root(args: argparse.Namespace) -> str | None:
    """The fleet repository the run judged: two repositories may both have
    inventory/lab.yaml, and `reconcile diff` compares runs of one."""
    root = _repo_root(args)
    return str(root) if root is not None else None


def _record_run(
    outs: RunOutputs,
    args: argparse.Namespace,
    build: Any,
    doc: Any,
    observations: Any,
    took: float,
    **more: Any,
) -> None:
    """The run's rows (`build`: record.drift_record or audit_record, `more` its own
    arguments) into the store."""
    assert outs.history is not None
    run = build(
        doc,
        observations,
        source=_source(args),
        started=outs.started,
        duration_s=took,
        root=_fleet_root(args),
        **more,
    )
    _record(outs.history, run)


def _record(path: Path, run: Any) -> None:
    import sqlite3

    from reconciler.history.store import HistoryError, opened, record

    try:
        with opened(path) as conn:
            record(conn, run)
    # ValueError: a value of the run SQLite cannot bind (text no UTF-8 holds): the run's
    # report was printed, its exit code stands; the store is as it was.
    except (HistoryError, sqlite3.Error, OSError, ValueError) as exc:
        print(f"warning: the run was not recorded in the history: {exc}", file=sys.stderr)
