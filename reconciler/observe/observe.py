"""Observe boxes: one collector run per box over SSH, plus the controller's own gateway probes,
all boxes at once. Each box's answer is read once (reconciler/observe/document.py) into a
typed document, or into a fault of that box: a box that is unreachable, broken or hostile is
that box's error and every other box is still observed. A BoxObservation keeps the raw JSON as
well, which is what `--save-snapshot` writes and `--from-snapshot` reads back (through the
same parser) for an offline comparison.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import InitVar, asdict, dataclass, field
from pathlib import Path
from queue import SimpleQueue
from typing import Any

from reconciler import fast_json
from reconciler.drift_inputs import DriftInputs
from reconciler.observe import fanout
from reconciler.observe.document import (
    MAX_ANSWER_BYTES,
    NO_PROBES,
    ControllerProbes,
    Fault,
    FaultKind,
    Observed,
    collector_failed,
    elapsed,
    load_json,
    parse_collected,
    parse_probes,
    printable,
    transport_fault,
)
from reconciler.observe.early import EarlyStart, launch
from reconciler.observe.transport import Background, Running

# The collector version a snapshot's document is in when it does not say (documents cut down
# by tests/lab/audit_scenarios.py keep only what the audit reads, without `collector`).
SNAPSHOT_COLLECTOR = 1
# A box's snapshot file holds its answer, indented, and the controller's probes beside it.
SNAPSHOT_FILE_LIMIT = 2 * MAX_ANSWER_BYTES


@dataclass
class BoxObservation:
    """One box: the raw answer as received (JSON-able: what a snapshot keeps) and, read from it
    once, the typed `document` and `probes`, or the `fault` that makes the box unobserved.

    A live answer is read with `complete=True` (every field the collector writes must be
    there); a snapshot's file (`snapshot_observation`) with `complete=False`, since a saved
    document may be cut down to what one command reads. After changing `controller` (the
    audit's phase 2 adds its proofs), call `reread()`."""

    box: str
    # The collector's JSON; None if it gave none we can use, or if a large replay read its
    # snapshot file straight into `document` (observe/document_c.py: a replay keeps no raw).
    collected: dict[str, Any] | None
    error: str | None  # why the box could not be observed at all (the fault's text)
    controller: dict[str, Any] = field(default_factory=dict)  # probes from the controller
    elapsed_s: float = 0.0
    # Set when the box answered only through an SSH master connection opened before, while new
    # connections are refused (its sshd died): observed in full, but not reachable anew.
    connection: str | None = None
    complete: InitVar[bool] = True  # False for a snapshot: absent fields read as not observed
    fault: InitVar[Fault | None] = None  # the answer was refused before it was JSON
    parsed: InitVar[Observed | None] = None  # `collected`, already read (while others answered)

    def __post_init__(self, complete: bool, fault: Fault | None, parsed: Observed | None) -> None:
        self._complete = complete
        self._fault = fault
        self.reread(parsed)

    def reread(self, parsed: Observed | None = None) -> None:
        """(Re)build the typed view from the raw fields."""
        self.document: Observed | None = None
        self.probes: ControllerProbes = NO_PROBES
        probes = parse_probes(self.controller)
        doc: Observed | Fault | None = None
        if self._fault is not None:
            doc = self._fault
        elif parsed is not None:
            doc = parsed
        elif self.collected is not None:
            # A live answer always says its version; a snapshot's may be cut down without it.
            assumed = None if self._complete else SNAPSHOT_COLLECTOR
            doc = parse_collected(self.collected, self._complete, assumed)
        elif self.error is not None:
            doc = Fault(FaultKind.RECORDED, printable(self.error, 500))
        else:
            doc = Fault(FaultKind.NOT_OBSERVED, "not observed")
        if isinstance(probes, Fault):
            doc = probes if not isinstance(doc, Fault) else doc
        else:
            self.probes = probes
        if isinstance(doc, Fault):
            # The refused answer is not kept: a snapshot records the fault, never the data.
            self._fault, self.collected, self.error = doc, None, str(doc)
        else:
            self._fault, self.document = None, doc

    @property
    def reachable(self) -> bool:
        return self.document is not None

    @property
    def failure(self) -> Fault | None:
        """Why the box is not observed (None when `document` is there)."""
        return self._fault


def observe(
    inputs: DriftInputs,
    boxes: list[str],
    run_key: str,
    timeout: float | None = None,
    early: EarlyStart | None = None,
) -> dict[str, BoxObservation]:
    """Observe `boxes`; `early` holds collectors already started from these same inputs.
    `timeout`: what one box may take (default: `--timeout`, FLEET_BOX_TIMEOUT, else 60 s)."""
    if early is None or early.run_key != run_key or set(early.running) != set(boxes):
        if early is not None:
            early.cancel()
        early = launch(inputs, boxes, run_key)
    return gather(early.running, early.probes, fanout.box_timeout() if timeout is None else timeout)


def gather(
    running: dict[str, Running], probes: Background, timeout: float
) -> dict[str, BoxObservation]:
    """Wait for every box's collector and for the controller's probes: one observation each.
    `timeout` is each box's own, counted from its start: a box that hangs costs that, and the
    other boxes are read (and counted on the progress line) as each answers."""
    started = time.monotonic()
    progress = fanout.Progress(len(running))
    try:
        answers = _finish_each(running, timeout, progress.update)
    finally:
        progress.close()
    try:
        controller = probes.result()
    except Exception:  # the probes are a part of each box's observation, never the run's end
        controller = {}
    elapsed = time.monotonic() - started
    out = {}
    for box, (raw, doc) in answers.items():
        # An unreachable box keeps the controller's probes: its gateway is still observed
        # from the mesh side (compare/partial.py), though the box itself is not.
        probed = controller.get(box) or {}
        if isinstance(doc, Fault):
            out[box] = BoxObservation(box, None, str(doc), probed, elapsed, fault=doc)
        else:
            # The check started beside the collector (transport.new_connections_refused) has
            # had the collector's whole run to finish: this wait is for a box that hangs.
            connection = running[box].refused_anew()
            out[box] = BoxObservation(box, raw, None, probed, elapsed, connection, parsed=doc)
    return out


Answer = tuple[dict[str, Any] | None, Observed | Fault]


def _finish_each(
    running: dict[str, Running], timeout: float, done: Callable[[int], None] = lambda n: None
) -> dict[str, Answer]:
    """Every box's answer at once, each read as soon as it arrives (while slower boxes are
    still working); whatever goes wrong reading one box is that box's fault (an answer that is
    not UTF-8 makes the pipe's decoding raise, for one). `done(n)` is told each time one more
    box is through. Boxes waiting for a slot (fanout.Queued) have a thread each too: it waits
    for the box's turn, which an earlier box's thread gives it when it finishes."""
    if not running:
        return {}
    # A thread per box, each saying when it is through (not a concurrent.futures pool: it
    # imports logging, ~7 ms of a repeated run's CPU).
    through: SimpleQueue[str] = SimpleQueue()

    def answer(box: str, handle: Running) -> Answer:
        try:
            return _answer(handle, timeout)
        finally:
            through.put(box)

    jobs = {box: Background(answer, box, handle) for box, handle in running.items()}
    out: dict[str, Answer] = {}
    for _ in jobs:
        box = through.get()
        try:
            out[box] = jobs[box].result()
        except UnicodeDecodeError:
            running[box].cancel()
            out[box] = (None, Fault(FaultKind.NOT_JSON, "not UTF-8"))
        except Exception as exc:  # one box's trouble, never the run's
            running[box].cancel()
            failed = f"reading the answer failed ({type(exc).__name__})"
            out[box] = (None, Fault(FaultKind.UNREACHABLE, failed))
        done(len(out))
    return {box: out[box] for box in running}  # the boxes' own order, not the finish order


def _answer(handle: Running, timeout: float) -> Answer:
    """One box's result -> its raw document and its typed reading, or its fault."""
    result = handle.finish(timeout, MAX_ANSWER_BYTES)
    if result.truncated:
        return None, Fault(
            FaultKind.TOO_LARGE, f"more than {MAX_ANSWER_BYTES} bytes: reading stopped"
        )
    if result.error:
        return None, transport_fault(result.error)
    if result.returncode != 0:
        return None, collector_failed(result.returncode, result.stderr)
    raw = load_json(result.stdout)
    if isinstance(raw, Fault):
        return None, raw
    doc = parse_collected(raw)  # a live answer: complete, and it states its version
    return (raw if isinstance(raw, dict) and not isinstance(doc, Fault) else None), doc


def snapshot_observation(
    box: str, path: Path, sha256: str | None = None, in_c: bool = False, raw_kept: bool = True
) -> BoxObservation:
    """One box's file of a saved snapshot -> its observation, through the same parser as a
    live answer; a missing, damaged or hostile file is that box's fault, never the run's.

    `sha256`: the file's digest as the snapshot's index recorded it (`recorded_digest`). A file
    that still has it is the text save_snapshot wrote with json.dumps from a parsed answer, so
    none of its objects can repeat a key, and json reads it without the per-object check (a
    Python call per object, ~20% of reading it); any other file gets the full check.
    `in_c`: such a file is read by msgspec (a large replay: load_json, fast_json.LARGE), and,
    unless `raw_kept` (for a caller that reads only the typed document: drift's replay),
    straight into the document (document_c.py), which gives what the two steps below give."""
    raw = None
    if path.is_file():
        data = _read_limited(path)
        unique = _written_as(data, sha256)
        if in_c and unique and not raw_kept and len(data) <= SNAPSHOT_FILE_LIMIT:
            typed = _typed_snapshot(box, data)
            if typed is not None:
                return typed
        raw = load_json(data, SNAPSHOT_FILE_LIMIT, keys_unique=unique, in_c=in_c)
    if raw is None:
        raw = Fault(FaultKind.NOT_OBSERVED, f"{path.name} is missing from the snapshot")
    if not isinstance(raw, Fault) and not isinstance(raw, dict):
        raw = Fault(FaultKind.MALFORMED, "expected an object", box)
    if isinstance(raw, Fault):
        return BoxObservation(box, None, str(raw), fault=raw)
    controller = raw.get("controller")
    if controller is not None and not isinstance(controller, dict):
        bad = Fault(FaultKind.MALFORMED, "expected an object", "controller")
        return BoxObservation(box, None, str(bad), fault=bad)
    fields = (raw.get("error"), raw.get("elapsed_s"), raw.get("connection"))
    return _from_file(box, raw.get("collected"), *fields, controller)


def _from_file(
    box: str,
    collected: dict[str, Any] | None,
    error: Any,
    elapsed_s: Any,
    connection: Any,
    controller: dict[str, Any] | None,
    parsed: Observed | None = None,
) -> BoxObservation:
    """A snapshot file's box, its fields as the file has them (each checked here)."""
    return BoxObservation(
        box,
        collected,
        error if isinstance(error, str) else None,
        controller or {},
        elapsed(elapsed_s),
        printable(connection, 500) if isinstance(connection, str) else None,
        complete=False,
        parsed=parsed,
    )


def _typed_snapshot(box: str, data: bytes) -> BoxObservation | None:
    from reconciler.observe.document_c import read_snapshot_file

    typed = read_snapshot_file(data)
    if typed is None:
        return None  # anything it does not read exactly as document.py does: read as always
    fields = (typed.error, typed.elapsed_s, typed.connection)
    return _from_file(box, None, *fields, typed.controller, typed.document)


def _written_as(data: bytes, sha256: str | None) -> bool:
    if sha256 is None:
        return False
    import hashlib  # only for a snapshot whose index has digests (~0.1 ms a box, SHA-NI)

    return hashlib.sha256(data).hexdigest() == sha256


def recorded_digest(index: Mapping[str, Any], box: str) -> str | None:
    """The SHA-256 save_snapshot recorded for this box's file, if the index has a well-formed
    one (snapshots written before it have none: their files take the full check)."""
    digests = index.get("sha256")
    digest = digests.get(box) if isinstance(digests, dict) else None
    if isinstance(digest, str) and len(digest) == 64 and _is_hex(digest):
        return digest
    return None


def _is_hex(text: str) -> bool:
    return text.isascii() and all(c in "0123456789abcdef" for c in text)


def snapshot_box_bytes(directory: Path, box: str) -> bytes:
    """A box's file of a snapshot, for a reader other than the replay (the history, `diff`):
    read within the replay's bound, ValueError past it (OSError when it cannot be read)."""
    data = _read_limited(directory / f"{box}.json")
    if len(data) > SNAPSHOT_FILE_LIMIT:
        raise ValueError(f"{box}.json is larger than the limit, {SNAPSHOT_FILE_LIMIT} bytes")
    return data


def _read_limited(path: Path) -> bytes:
    # Read one byte past the limit at most: load_json then refuses it as too large. The read is
    # sized by the file (read(n) allocates n bytes first: 16 MB per box for a 150 KB file), and
    # a file that grew since fstat is read on, up to the same limit.
    with path.open("rb") as handle:
        want = min(os.fstat(handle.fileno()).st_size, SNAPSHOT_FILE_LIMIT) + 1
        data = handle.read(want)
        if len(data) == want <= SNAPSHOT_FILE_LIMIT:
            data += handle.read(SNAPSHOT_FILE_LIMIT + 1 - want)
        return data


# -- snapshots -------------------------------------------------------------------------------------
SNAPSHOT_VERSION = 1


def save_snapshot(
    directory: Path,
    observations: dict[str, BoxObservation],
    meta: dict[str, Any],
    facts: Mapping[str, str] | None = None,
) -> None:
    """One JSON file per box plus an index; secrets were hashed on the boxes already.
    `facts`: the desired-state files from outside the repository the run was judged against,
    copied into facts/ so the snapshot replays anywhere (reconciler/desired/facts.py)."""
    import hashlib

    from reconciler.desired.facts import write_facts

    directory.mkdir(parents=True, exist_ok=True)
    write_facts(directory, facts or {})
    index = {"snapshot": SNAPSHOT_VERSION, **meta, "boxes": sorted(observations)}
    if facts:
        index["facts"] = sorted(facts)
    digests = {}
    for name, obs in observations.items():
        # From parsed dicts, keys sorted (mixed key types would fail): no object of the text
        # can repeat a key, which its recorded digest lets a replay rely on (`sha256` below).
        data = (json.dumps(asdict(obs), indent=1, sort_keys=True) + "\n").encode("utf-8")
        (directory / f"{name}.json").write_bytes(data)
        digests[name] = hashlib.sha256(data).hexdigest()
    index["sha256"] = dict(sorted(digests.items()))
    (directory / "index.json").write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")


def load_snapshot(directory: Path) -> tuple[dict[str, Any], dict[str, BoxObservation]]:
    index = snapshot_index(directory)
    observations = {}
    in_c = len(index["boxes"]) >= fast_json.LARGE
    for name in index["boxes"]:
        path = directory / f"{name}.json"
        digest = recorded_digest(index, name)
        observations[name] = snapshot_observation(name, path, digest, in_c)
    return index, observations


def snapshot_index(directory: Path) -> dict[str, Any]:
    """A snapshot's index.json, checked: its `boxes` are plain names (one file each).

    Read within a box file's bounds (size, UTF-8, depth, no repeated key): a snapshot may come
    from anywhere, and an index of gigabytes, or nested past the parser, is the run's error
    (a ValueError) like any other damage, never a traceback. ~100 bytes a box: 16 MB is
    ~150,000 boxes."""
    path = directory / "index.json"
    index = load_json(_read_limited(path), SNAPSHOT_FILE_LIMIT)
    if isinstance(index, Fault):
        raise ValueError(f"{path}: {index.what}")
    # The index is the run's, not a box's: a damaged one is the run's error (a ValueError the
    # commands report), never a traceback. Its version is not echoed: it may be any text.
    if not isinstance(index, dict) or index.get("snapshot") != SNAPSHOT_VERSION:
        raise ValueError(
            f"{directory}/index.json: not a snapshot index of version {SNAPSHOT_VERSION}"
        )
    boxes = index.get("boxes")
    if not isinstance(boxes, list) or not all(_box_file_name(b) for b in boxes):
        raise ValueError(f"{directory}/index.json: boxes is not a list of box names")
    return index


def _box_file_name(name: Any) -> bool:
    # Each name becomes DIR/<name>.json: a plain name, never a path out of the snapshot.
    return (
        isinstance(name, str)
        and 0 < len(name) <= 253
        and name.replace("-", "").replace("_", "").replace(".", "").isalnum()
        and not name.startswith(".")
    )
