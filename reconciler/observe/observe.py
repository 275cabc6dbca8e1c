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
import re
import stat
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from queue import SimpleQueue
from typing import TYPE_CHECKING, Any, cast

from reconciler import fast_json, interrupts
from reconciler.drift_inputs import DriftInputs
from reconciler.observe import fanout
from reconciler.observe.document import (
    MAX_ANSWER_BYTES,
    NO_PROBES,
    SNAPSHOT_DEPTH,
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
from reconciler.observe.probes import GRACE_S, unanswered_gateway, unmade_gateway
from reconciler.observe.transport import Background, Pool, Running
from reconciler.pids import may_run
from reconciler.records import asdict, field, record_class

if TYPE_CHECKING:
    from dataclasses import InitVar  # records.py reads the annotation's text at run time

# The collector version a snapshot's document is in when it does not say (documents cut down
# by tests/lab/audit_scenarios.py keep only what the audit reads, without `collector`).
SNAPSHOT_COLLECTOR = 1
# A box's snapshot file holds its answer, indented, and the controller's probes beside it.
SNAPSHOT_FILE_LIMIT = 2 * MAX_ANSWER_BYTES


@record_class(frozen=False)
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
        # A snapshot's box file whose bytes are not those its index recorded: why (the box's
        # error in a replay, compare/box.py). Not a field: never saved with the observation.
        self.altered: str | None = None
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
    if timeout is None:
        timeout = fanout.box_timeout()
    if early is None or early.run_key != run_key or set(early.running) != set(boxes):
        if early is not None:
            early.cancel()
        early = launch(inputs, boxes, run_key, timeout)
    try:
        return gather(early.running, early.probes, timeout)
    except BaseException:  # Ctrl-C while the boxes work (an apply's drift): no ssh left behind
        early.cancel()
        raise


# How long past the run's deadline (its start and one box's timeout) gather still waits for the
# controller's probes: they end by their own deadline (observe/probes.py GRACE_S) before this.
PROBES_GRACE_S = 2 * GRACE_S


def gather(
    running: dict[str, Running], probes: Background, timeout: float
) -> dict[str, BoxObservation]:
    """Wait for every box's collector and for the controller's probes: one observation each.
    `timeout` is each box's own, counted from its start: a box that hangs costs that, and the
    other boxes are read (and counted on the progress line) as each answers. The probes (all
    started at once, with the collectors) are waited for until `timeout` from here (and
    PROBES_GRACE_S): past it every box's controller probes say they gave no answer."""
    started = time.monotonic()
    progress = fanout.Progress(len(running))
    try:
        answers = _finish_each(running, timeout, progress.update)
    finally:
        progress.close()
    try:
        controller = probes.result(max(0.0, started + timeout + PROBES_GRACE_S - time.monotonic()))
    except TimeoutError:  # a probe that hangs is its box's failed probe, never the run's hang
        controller = {box: unanswered_gateway(timeout) for box in running}
    except Exception as exc:  # the probes are a part of each box's observation, never the run's end
        # Each box's probes say the controller could not make them (its fault, never the
        # gateway's). An empty answer read as no probes made at all: the mesh side unobserved
        # and nothing said of why.
        why = f"{type(exc).__name__} in its probes"  # the kind only: the text could hold anything
        controller = {box: unmade_gateway(why) for box in running}
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
    """Every box's answer, each read as soon as it arrives (while slower boxes are still
    working); whatever goes wrong reading one box is that box's fault (an answer that is not
    UTF-8 makes the pipe's decoding raise, for one). `done(n)` is told each time one more box
    is through.

    A reader thread per box in flight, not per box of the fleet: as many as boxes may run at
    once (fanout.Slots' size; every box when none waits in line), each taking the next box in
    the order the boxes start in (collectors.start_collectors: the line is that order), so
    every box that has started has a reader; a box in line is waited for by the reader that
    took it until an earlier box's end gives it its turn. A thread per box made ~1,000 threads
    for a 1,000-box fleet (past a container's pids limit, say). Not a concurrent.futures pool:
    it imports logging, ~7 ms of a repeated run's CPU (transport.Pool)."""
    if not running:
        return {}
    through: SimpleQueue[tuple[str, Answer | None, BaseException | None]] = SimpleQueue()

    def read(item: tuple[str, Running]) -> None:
        box, handle = item
        try:
            through.put((box, _answer(handle, timeout), None))
        except BaseException as exc:  # that box's, said below (and never a lost reader)
            through.put((box, None, exc))

    Pool(running.items(), _readers(running), read)
    out: dict[str, Answer] = {}
    for _ in running:
        # In slices: a Ctrl-C Python swallowed (raised in a weakref callback) ends the wait
        # within one, not after the last box's timeout.
        box, answer, failed = interrupts.get(through)
        if answer is not None:
            out[box] = answer
        elif not isinstance(failed, Exception):
            raise failed or RuntimeError(f"{box}: no answer and no failure")
        elif isinstance(failed, UnicodeDecodeError):
            running[box].cancel()
            out[box] = (None, Fault(FaultKind.NOT_JSON, "not UTF-8"))
        else:  # one box's trouble, never the run's
            running[box].cancel()
            failed_as = f"reading the answer failed ({type(failed).__name__})"
            out[box] = (None, Fault(FaultKind.UNREACHABLE, failed_as))
        done(len(out))
    return {box: out[box] for box in running}  # the boxes' own order, not the finish order


def _readers(running: dict[str, Running]) -> int:
    """How many boxes can be in flight at once: the line's size when boxes wait in one (all
    boxes of a run share one line), else every box (all started at once)."""
    sizes = [h.line_size for h in running.values() if isinstance(h, fanout.Queued)]
    return min(len(running), max(sizes)) if sizes else len(running)


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
    box: str,
    path: Path,
    sha256: str | None = None,
    in_c: bool = False,
    raw_kept: bool = True,
    data: bytes | None = None,
) -> BoxObservation:
    """One box's file of a saved snapshot -> its observation, through the same parser as a
    live answer; a missing, damaged or hostile file is that box's fault, never the run's.

    `sha256`: the file's digest as the snapshot's index recorded it (`recorded_digest`). A file
    that still has it is the text save_snapshot wrote with json.dumps from a parsed answer, so
    none of its objects can repeat a key, and json reads it without the per-object check (a
    Python call per object, ~20% of reading it); any other file gets the full check.
    `in_c`: such a file is read by msgspec (a large replay: load_json, fast_json.LARGE), and,
    unless `raw_kept` (for a caller that reads only the typed document: drift's replay),
    straight into the document (document_c.py), which gives what the two steps below give.
    `data`: the file's bytes as `snapshot_box_bytes` read them, for a caller that keeps them
    too (a recorded replay packs them for the history): read once, not twice."""
    altered = None
    try:
        if data is None:
            data = _read_limited(path)
    except FileNotFoundError:
        raw: Any = Fault(FaultKind.NOT_OBSERVED, f"{path.name} is missing from the snapshot")
    except NotRegularFile as exc:  # a FIFO, a device, a directory: never read
        raw = Fault(FaultKind.NOT_OBSERVED, f"{path.name} is {exc}")
    except OSError as exc:  # unreadable (permissions, a loop of symlinks): this box's fault
        raw = Fault(FaultKind.NOT_OBSERVED, f"{path.name} cannot be read ({_os_reason(exc)})")
    else:
        unique = _written_as(data, sha256)
        if sha256 is not None and not unique:
            # Edited since it was saved (by hand, a tool, a damaged disk): whatever it says
            # now (a render of another .env, a section gone) is read as it is, and this said.
            altered = f"{path.name} changed since it was saved (its sha256 is not the index's)"
        if in_c and unique and not raw_kept and len(data) <= SNAPSHOT_FILE_LIMIT:
            typed = _typed_snapshot(box, data)
            if typed is not None:
                return typed
        raw = load_json(
            data, SNAPSHOT_FILE_LIMIT, keys_unique=unique, in_c=in_c, depth=SNAPSHOT_DEPTH
        )
    if not isinstance(raw, Fault) and not isinstance(raw, dict):
        raw = Fault(FaultKind.MALFORMED, "expected an object", box)
    if isinstance(raw, Fault):
        obs = BoxObservation(box, None, str(raw), fault=raw)
    else:
        controller = raw.get("controller")
        if controller is not None and not isinstance(controller, dict):
            bad = Fault(FaultKind.MALFORMED, "expected an object", "controller")
            obs = BoxObservation(box, None, str(bad), fault=bad)
        else:
            fields = (raw.get("error"), raw.get("elapsed_s"), raw.get("connection"))
            obs = _from_file(box, raw.get("collected"), *fields, controller)
    obs.altered = altered
    return obs


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
    read within the replay's bound, ValueError past it or when it is not a regular file
    (NotRegularFile: a FIFO, a device), OSError when it cannot be read."""
    data = _read_limited(directory / f"{box}.json")
    if len(data) > SNAPSHOT_FILE_LIMIT:
        raise ValueError(f"{box}.json is larger than the limit, {SNAPSHOT_FILE_LIMIT} bytes")
    return data


class NotRegularFile(ValueError):
    """A snapshot's file that is not a regular file (its text: `not a regular file (fifo)`)."""


_FILE_KINDS = {
    stat.S_IFDIR: "directory",
    stat.S_IFIFO: "fifo",
    stat.S_IFCHR: "character device",
    stat.S_IFBLK: "block device",
    stat.S_IFSOCK: "socket",
}


def _regular(info: os.stat_result) -> int:
    """The size of a regular file's `info`; NotRegularFile naming the type of anything else."""
    if not stat.S_ISREG(info.st_mode):
        kind = _FILE_KINDS.get(stat.S_IFMT(info.st_mode), "unknown type")
        raise NotRegularFile(f"not a regular file ({kind})")
    return info.st_size


_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


def _read_limited(path: Path) -> bytes:
    """A snapshot file's bytes, one past the limit at most (load_json then refuses it as too
    large). FileNotFoundError when there is none; NotRegularFile for a FIFO, a device, a
    directory or a socket (a FIFO would block the run forever): the path is stat'ed before it
    is opened, never opened otherwise (a device's open may act), and the open file is checked
    again (a file swapped in between), as the collector's read_file does on the box.

    The read is sized by the file (a read of n allocates n bytes first: 16 MB per box for a
    150 KB file), and a file that grew since fstat is read on, up to the same limit."""
    _regular(os.stat(path))
    fd = os.open(path, _OPEN_FLAGS)  # O_NONBLOCK: a FIFO swapped in is not waited on
    try:
        cap = SNAPSHOT_FILE_LIMIT + 1
        want = min(_regular(os.fstat(fd)) + 1, cap)
        chunks, total = [], 0
        while total < want:
            chunk = os.read(fd, want - total)
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if total == want:
                want = cap  # as large as fstat said (it may have grown): read on to the limit
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)  # b"": an empty file
    finally:
        os.close(fd)


def _os_reason(exc: OSError) -> str:
    return exc.strerror or type(exc).__name__


# -- snapshots -------------------------------------------------------------------------------------
SNAPSHOT_VERSION = 1


# A box file is DIR/<box>.json beside DIR/index.json: a box so named would be overwritten by it.
INDEX_BOX = "index"


def save_snapshot(
    directory: Path,
    observations: dict[str, BoxObservation],
    meta: dict[str, Any],
    facts: Mapping[str, str] | None = None,
) -> None:
    """One JSON file per box plus an index; secrets were hashed on the boxes already (one
    sent in clear is masked, `_box_file`).
    `facts`: the desired-state files from outside the repository the run was judged against,
    copied into facts/ so the snapshot replays anywhere (reconciler/desired/facts.py).

    Built whole in a new directory beside DIR, then renamed into place: a save that fails (a
    full disk, a file too large) leaves the snapshot that was there as it was, never a mix of
    two runs. Where DIR cannot be renamed (its directory is not writable, or DIR is a mount
    point), built in a hidden directory inside DIR and moved in file by file, the index last
    (`_moved_in`). A save interrupted earlier is recovered first (`_recover`); one stopped by
    SIGTERM or SIGHUP cleans up as one interrupted by Ctrl-C does, then ends by that signal
    (`_stops_cleanly`). ValueError, nothing written, for a DIR `snapshot_target_problem`
    refuses or a box named `index` (its file would be the index)."""
    if INDEX_BOX in observations:
        raise ValueError(index_box_problem())
    problem = snapshot_target_problem(directory)  # and an interrupted save recovered
    if problem is not None:
        raise ValueError(problem)
    with _stops_cleanly():
        _save(directory, observations, meta, facts)


def _save(
    directory: Path,
    observations: dict[str, BoxObservation],
    meta: dict[str, Any],
    facts: Mapping[str, str] | None,
) -> None:
    import hashlib
    import shutil

    from reconciler.desired.facts import write_facts

    real = Path(os.path.realpath(directory))  # a symlink's target is what is replaced
    in_place = _in_place(real)
    if not in_place:
        real.parent.mkdir(parents=True, exist_ok=True)
    building = _new_directory_in(real) if in_place else _new_directory_beside(real)
    try:
        write_facts(building, facts or {})
        index = {"snapshot": SNAPSHOT_VERSION, **meta, "boxes": sorted(observations)}
        if facts:
            index["facts"] = sorted(facts)
        digests = {}
        for name, obs in observations.items():
            # No object of the text repeats a key (`_box_file`), which its recorded digest
            # lets a replay rely on (`sha256` below).
            data = _box_file(name, obs)
            (building / f"{name}.json").write_bytes(data)
            digests[name] = hashlib.sha256(data).hexdigest()
        index["sha256"] = dict(sorted(digests.items()))
        text = json.dumps(index, indent=2, allow_nan=False) + "\n"
        (building / "index.json").write_text(text, encoding="utf-8")
        if in_place:
            _moved_in(building, real, {f"{name}.json" for name in observations})
        else:
            _into_place(building, real)
    finally:
        shutil.rmtree(building, ignore_errors=True)  # gone already once renamed into place


class _Stopped(BaseException):
    """SIGTERM or SIGHUP during a save: raised where the save is, so that its `finally` and
    `except BaseException` clean-ups run (never caught as an error by an `except Exception`)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _stop(signum: int, frame: object) -> None:
    raise _Stopped(signum)


@contextmanager
def _stops_cleanly() -> Iterator[None]:
    """While a save runs, SIGTERM and SIGHUP (a service stopped, a terminal closed) end it as
    Ctrl-C does: the directory it was building is removed and a snapshot it had moved aside
    is put back; the process then ends by the same signal, as it would have at once (Python's
    default for them, which left a full hidden copy beside DIR, `.DIR.saving-*`, until the next
    save to DIR). A signal its caller handles or ignores is left as it is; so is a save in a
    thread other than the main one (only that thread can take a signal's handler)."""
    import signal

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    taken = {}
    for signum in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(signum) == signal.SIG_DFL:
            taken[signum] = signal.signal(signum, _stop)
    try:
        yield
    except _Stopped as stopped:
        for signum in taken:
            signal.signal(signum, signal.SIG_DFL)
        taken = {}
        os.kill(os.getpid(), stopped.signum)  # its default action: the process ends here
        raise
    finally:
        for signum, handler in taken.items():
            signal.signal(signum, handler)


def _box_file(name: str, obs: BoxObservation) -> bytes:
    """A box's snapshot file. From parsed dicts, keys sorted (mixed key types would fail): no
    object of the text can repeat a key. No NaN or Infinity: the replay would refuse what was
    written. One box's file that cannot be written so (nested past what json.dumps takes: an
    observation not read through load_json) is saved as that box's fault, never the run's.

    A box that sent a secret in clear (an older or broken collector: every secret is hashed on
    the box) is saved masked, as the history store keeps it (`_saved`): the run's reports
    never showed the value, and a file on the controller's disk must not hold it either."""
    try:
        text = json.dumps(_saved(asdict(obs)), indent=1, sort_keys=True, allow_nan=False)
    except (RecursionError, ValueError, TypeError) as exc:
        why = f"its observation could not be saved in the snapshot ({type(exc).__name__})"
        kept = BoxObservation(name, None, why, elapsed_s=obs.elapsed_s)
        text = json.dumps(asdict(kept), indent=1, sort_keys=True, allow_nan=False)
    return (text + "\n").encode("utf-8")


# The collector's hash of a secret inside a word (`--hf-token={"secret": "hmac:..."}`)
_INLINE_DIGEST = re.compile(r'\{"secret": "hmac:[0-9a-f]{64}"\}')
_QUOTED_MASK = re.compile(r"([\"'])\*\*\*\1")  # `"***"`: the store's mask, unquoted


def _saved(doc: dict[str, Any]) -> dict[str, Any]:
    """The box file's document with what the store masks (masking.stored: a secret the box
    sent in clear, an older or broken collector's) masked, and everything else as the box
    sent it. A word whose only secrets are the collector's own digests keeps them: the store
    masks those too, but a replay compares them (a knob's inline `--api-key`)."""
    from reconciler.history.masking import stored

    return cast(dict[str, Any], _merged(doc, stored(doc)))


def _merged(doc: Any, masked: Any) -> Any:
    """`masked` where it masked a clear value, `doc` elsewhere. `stored` copies only the path to
    what it masked: an unchanged part is the same object, not walked."""
    if doc is masked:
        return doc
    if type(doc) is dict and type(masked) is dict and doc.keys() == masked.keys():
        return {key: _merged(value, masked[key]) for key, value in doc.items()}
    if type(doc) is list and type(masked) is list and len(doc) == len(masked):
        return list(map(_merged, doc, masked))
    if type(doc) is str and type(masked) is str and _INLINE_DIGEST.search(doc):
        # Masked only where the digests were: the digests kept. A clear value beside them
        # leaves a difference the digests do not explain: masked.
        digests_masked = _QUOTED_MASK.sub("***", _INLINE_DIGEST.sub("***", doc))
        return doc if digests_masked == _QUOTED_MASK.sub("***", masked) else masked
    return masked


def index_box_problem() -> str:
    return (
        f"a box named {INDEX_BOX!r} cannot be saved in a snapshot: its file would be the "
        "snapshot's index.json"
    )


# A save's own directories, each named with the saving process's id: beside DIR,
# `.DIR.saving-<pid>-<hex>` (the new snapshot, built) and `.DIR.saving-<pid>-<hex>.old` (the
# previous one, moved aside for an instant); inside DIR (a save in place),
# `.saving-<pid>-<hex>`.
_SAVING = ".saving-"
_ASIDE = ".old"


def _new_directory_beside(real: Path) -> Path:
    """A new, empty directory next to `real`, with `real`'s mode if it exists (the umask's
    otherwise, as mkdir makes it)."""
    try:
        mode: int | None = stat.S_IMODE(real.stat().st_mode)
    except FileNotFoundError:
        mode = None
    while True:
        path = real.with_name(f".{real.name}{_SAVING}{os.getpid()}-{os.urandom(4).hex()}")
        try:
            path.mkdir(0o777)
        except FileExistsError:
            continue
        if mode is not None:
            path.chmod(mode)
        return path


def _new_directory_in(real: Path) -> Path:
    """A new, private, hidden directory inside `real` (a save in place builds there: on
    DIR's own file system, so each file is then moved in by one rename)."""
    while True:
        path = real / f"{_SAVING}{os.getpid()}-{os.urandom(4).hex()}"
        try:
            path.mkdir(0o700)
        except FileExistsError:
            continue
        return path


def _into_place(building: Path, real: Path) -> None:
    """`building` renamed to `real`; a snapshot there is moved aside first and removed once the
    new one is in place. Interrupted (an error, KeyboardInterrupt) with the old one aside and
    none in place, it is put back; a kill there is recovered by the next save (`_recover`)."""
    import errno
    import shutil

    aside = building.with_name(building.name + _ASIDE)  # this save's own name: none before
    try:
        try:
            os.rename(building, real)  # nothing there, or an empty directory: replaced at once
            return
        except OSError as exc:
            if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                raise
        os.rename(real, aside)
        os.rename(building, real)
    except BaseException:  # told by what is there: an interrupt may come as a rename returns
        if os.path.lexists(aside) and not os.path.lexists(real):
            os.rename(aside, real)
        raise
    shutil.rmtree(aside, ignore_errors=True)


def _moved_in(building: Path, real: Path, boxes: set[str]) -> None:
    """A snapshot built in `building` (inside `real`) moved into `real` itself: facts/, each
    box file, index.json last, each by one rename (atomic); then what the previous snapshot
    had and this one has not is removed (its box files, its facts/). Not atomic as a whole:
    until the index is moved, the previous index is read with some of the new box files
    (which its digests refuse, never read as its own run's); then, until removed, box files
    the new index does not list lie beside it (never read)."""
    import shutil

    from reconciler.desired.facts import FACTS

    new_facts = building / FACTS
    if new_facts.is_dir():
        if (real / FACTS).is_dir() and not (real / FACTS).is_symlink():
            os.rename(real / FACTS, building / f"{FACTS}{_ASIDE}")  # removed with `building`
        os.rename(new_facts, real / FACTS)
    for name in sorted(boxes):
        os.replace(building / name, real / name)
    os.replace(building / "index.json", real / "index.json")
    for name in os.listdir(real):
        entry = real / name
        stale = name.endswith(".json") and name not in boxes and name != "index.json"
        if stale and (entry.is_file() or entry.is_symlink()):
            entry.unlink(missing_ok=True)
    if not new_facts.exists() and (real / FACTS).is_dir():
        shutil.rmtree(real / FACTS, ignore_errors=True)


def _in_place(real: Path) -> bool:
    """Whether a save writes into DIR itself rather than replace it: DIR is a directory that
    cannot be renamed, its directory not writable (a DIR of the operator's under a
    root-owned one), or a mount point (a rename is EBUSY there)."""
    try:
        info = real.stat()
    except OSError:
        return False
    if not stat.S_ISDIR(info.st_mode):
        return False
    if not os.access(real.parent, os.W_OK | os.X_OK):
        return True
    if os.path.ismount(real):
        return True
    try:
        return info.st_dev != real.parent.stat().st_dev
    except OSError:
        return True


def _recover(real: Path) -> None:
    """What an interrupted save left (a kill, a power cut): the previous snapshot still aside
    with none at DIR is put back (said on stderr); the unfinished builds of processes that
    are gone are removed, beside DIR and inside it. A live process's are left alone: it may
    be saving now."""
    import shutil
    import sys

    prefix = f".{real.name}{_SAVING}"
    try:
        beside = [n for n in os.listdir(real.parent) if n.startswith(prefix)]
    except OSError:
        beside = []
    dead = [n for n in beside if not _alive(n[len(prefix) :])]
    asides = [n for n in dead if n.endswith(_ASIDE)]
    if asides and not os.path.lexists(real):
        newest = max(asides, key=lambda n: _mtime(real.parent / n))
        try:
            os.rename(real.parent / newest, real)
        except OSError:
            pass
        else:
            print(
                f"note: {real}: an interrupted save had left the previous snapshot aside as "
                f"{real.parent / newest}; it was put back",
                file=sys.stderr,
            )
    for name in dead:
        leftover = real.parent / name
        if os.path.lexists(leftover) and (not name.endswith(_ASIDE) or os.path.lexists(real)):
            shutil.rmtree(leftover, ignore_errors=True)
    try:
        inside = [n for n in os.listdir(real) if n.startswith(_SAVING)]
    except OSError:
        inside = []
    for name in inside:
        if not _alive(name[len(_SAVING) :]):
            shutil.rmtree(real / name, ignore_errors=True)


def _alive(tag: str) -> bool:
    """Whether the process that named a save's directory `<pid>-...` may still run (True
    when the name says no process id: not removed)."""
    pid_text = tag.split("-", 1)[0]
    if not pid_text.isdigit() or int(pid_text) <= 0:
        return True
    return may_run(int(pid_text))


def _mtime(path: Path) -> float:
    try:
        return path.lstat().st_mtime
    except OSError:
        return 0.0


def snapshot_target_problem(path: str | Path, option: str = "--save-snapshot") -> str | None:
    """Why a snapshot cannot be saved at `path` (said before any box is contacted), or None;
    the same rules as save_snapshot, which calls it. A save interrupted earlier is recovered
    first (`_recover`): the check and the save then judge the same directory.

    save_snapshot replaces the directory whole: it must be new, empty, or a snapshot holding
    only a snapshot's files (a directory of anything else would be dropped with it), never a
    file, nor the working directory. A new one is made in the nearest existing directory
    above it, which must be writable; an existing one is built beside and renamed over, or,
    where it cannot be renamed (its directory not writable, a mount point), written into:
    it must be writable itself then."""
    real = Path(os.path.realpath(path))
    try:
        _recover(real)
        mode: int | None = real.stat().st_mode
    except FileNotFoundError:
        mode = None
    except OSError as exc:  # a name too long, a component that is not a directory
        return f"{option} {path}: {_os_reason(exc)}"
    if mode is not None and not stat.S_ISDIR(mode):
        return f"{option} {path}: not a directory"
    if mode is None:
        above = real.parent
        while not above.exists() and above != above.parent:
            above = above.parent
        if not above.is_dir():
            return f"{option} {path}: {above} is not a directory"
        if not os.access(above, os.W_OK | os.X_OK):
            return f"{option} {path}: the directory {above} is not writable"
        return None
    cwd = Path.cwd()
    if real == cwd or real in cwd.parents:
        return f"{option} {path}: the working directory (or one above it) is not replaced"
    foreign = _not_a_snapshots(real)
    if foreign is not None:
        return (
            f"{option} {path}: {foreign}; name a new or empty directory, or an earlier "
            "snapshot (it is replaced whole)"
        )
    if _in_place(real) and not os.access(real, os.W_OK | os.X_OK):
        return (
            f"{option} {path}: neither it nor (to replace it) the directory {real.parent} "
            "is writable"
        )
    return None


def _not_a_snapshots(directory: Path) -> str | None:
    """What in an existing directory is not a snapshot's, or None (empty, or a snapshot)."""
    try:
        names = os.listdir(directory)
    except OSError as exc:
        return f"it cannot be listed ({_os_reason(exc)})"
    if "lost+found" in names and os.path.ismount(directory):  # a file system's own: kept
        names.remove("lost+found")  # (a mount point is saved into, never replaced)
    if not names:
        return None
    try:
        snapshot_index(directory)
    except (OSError, ValueError):
        return "it holds files and no snapshot index"
    for name in sorted(names):
        entry = directory / name
        if name == "facts" and entry.is_dir():
            continue
        if name.endswith(".json") and entry.is_file():
            continue
        return f"it holds {printable(name, 80)!r}, which is not a snapshot's"
    return None


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
    try:
        data = _read_limited(path)
    except NotRegularFile as exc:  # a FIFO would block the run forever
        raise ValueError(f"{path}: {exc}") from None
    index = load_json(data, SNAPSHOT_FILE_LIMIT, depth=SNAPSHOT_DEPTH)
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
    # The run id names the replay in its reports and its history: text any of them can
    # write. A lone surrogate (JSON's `\ud800` allows one) is text no UTF-8 holds: the store
    # could not bind it. Control characters are text: every reader escapes them.
    run_id = index.get("run_id", "")
    try:
        if not isinstance(run_id, str):
            raise TypeError(run_id)
        run_id.encode()
    except (TypeError, UnicodeEncodeError):
        raise ValueError(f"{directory}/index.json: run_id is not UTF-8 text") from None
    return index


def _box_file_name(name: Any) -> bool:
    # Each name becomes DIR/<name>.json: a plain name, never a path out of the snapshot.
    return (
        isinstance(name, str)
        and 0 < len(name) <= 253
        and name.replace("-", "").replace("_", "").replace(".", "").isalnum()
        and not name.startswith(".")
    )
