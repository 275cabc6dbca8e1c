"""Which parts of a box a drift run did not observe, and so which of its entries it cannot
vouch for. Pure.

A box reached over SSH whose dockerd was down has no lane entries because no container was
inspected, not because its lanes are in sync: its zero is not known. The report's faults say
which part failed (compare/drift.py's Part); the HTML matrix already maps each part to the
columns it answers for (report/html.py `_UNSEEN`), and the history, `reconcile diff`, the
sparklines and the metrics read the same map: one rule for "not observed" everywhere.

A run records each box's fault parts (store schema 4, `boxes.faults`). A run recorded before
kept its report (`runs.report`), whose `boxes[].errors` are each fault's text, which begins
with where the fault is (`login_shell: bash -lc timed out`, `docker: ...`): the parts are read
back from those words (`part_of`). Only a fault whose text names no part (NOT_RECORDED) is not
known: its box is compared as recorded, and `reconcile diff` says so, rather than hiding every
entry of a box whose login shell once timed out.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

LANES = "lanes"  # every lane's column, as the history names it (html.LANES is "")
GATEWAY = "gateway"
BOX_WIDE = "box-wide"
EVERY = frozenset({LANES, GATEWAY, BOX_WIDE})
# How a reason names the columns, in this order.
_WORDS = {LANES: "the lanes", GATEWAY: "the gateway", BOX_WIDE: "the box as a whole"}


def faults_of(errors: Iterable[Any]) -> tuple[str, ...]:
    """The parts a box's faults are about (compare.drift.Part values), each once, in the
    faults' order; a fault made as a plain string names no part (html.unobserved's rule)."""
    from reconciler.compare.drift import Part

    parts = (getattr(e, "part", None) for e in errors)
    return tuple(dict.fromkeys(str(p.value) for p in parts if isinstance(p, Part)))


# A fault of a run recorded before the parts were kept whose text names no part (or whose
# report could not be read): its columns are compared as recorded, and said to be.
NOT_RECORDED = "(not recorded)"

# How a fault's text begins (compare/box.py's `where`, compare/envfile.py's `secret NAME`),
# and its part: the words every reconciler since the history began (78df85f) wrote.
# tests/unit/test_review4_history.py holds them to the faults compare makes today.
_BEGINS = (
    ("deployment directory ", "deployment"),
    ("gateway (loopback): ", "gateway-probe"),
    ("gateway health (loopback): ", "gateway-probe"),
    ("gateway capabilities (loopback): ", "gateway-probe"),
    ("gateway models_noauth (loopback): ", "gateway-probe"),
    ("login_shell: ", "login_shell"),
    ("variables: ", "variables"),
    ("gateway: ", "gateway-probe"),  # not in the observation (a snapshot without it)
    ("docker: ", "docker"),
    ("render: ", "render"),
    ("secret ", "secret-source"),
    ("lanes: ", "gateway-probe"),  # the lanes' windows, probed through the gateway
    ("file ", "box-file"),
    ("ssh: ", "connection"),
    ("config hashes: ", "config-hash"),  # newer than the history: recorded with its part too
)


def part_of(text: Any) -> str | None:
    """The part a fault's text (as a report keeps it) is about, or None when it names none."""
    if isinstance(text, str):
        for start, part in _BEGINS:
            if text.startswith(start):
                return part
    return None


def known(
    errors: int, faults: Sequence[str] | None, texts: Sequence[Any] | None = None
) -> tuple[str, ...]:
    """A stored box's fault parts: as recorded (schema 4 on); none for a box without errors;
    for one recorded with errors before the parts were kept, as its report's error `texts`
    name them, NOT_RECORDED for each that names none (or for all, without `texts`)."""
    if faults is not None:
        return tuple(faults)
    if errors == 0:
        return ()
    named = [part_of(t) for t in texts or ()]
    if len(named) < errors:  # the report is gone, unreadable, or holds fewer texts
        named.append(None)
    return tuple(dict.fromkeys(NOT_RECORDED if p is None else p for p in named))


def unseen_columns(faults: Sequence[str] | None) -> frozenset[str]:
    """The columns (LANES: every lane, GATEWAY, BOX_WIDE) whose entries `faults` leave not
    observed. None (no word at all) and a part this code does not know (a newer reconciler's):
    every column. NOT_RECORDED: none (compared as recorded; the caller says so)."""
    if faults is None:
        return EVERY
    faults = [f for f in faults if f != NOT_RECORDED]
    if not faults:
        return frozenset()  # the usual box: nothing to map (and the HTML module not imported)
    from reconciler.compare.drift import Part
    from reconciler.report.html import _UNSEEN
    from reconciler.report.html import LANES as HTML_LANES

    out: set[str] = set()
    for name in faults:
        try:
            part = Part(name)
        except ValueError:
            return EVERY
        out.update(LANES if col == HTML_LANES else col for col in _UNSEEN.get(part, ()))
    return frozenset(out)


# Whose probe of the gateway a gateway-probe fault is (compare/box.py's `where`): the box's own
# (`gateway health (loopback)`, the lanes' windows read through it) or the controller's
# (`gateway health (from the controller)`). An auth entry names the probe that saw it
# (compare/gateway.py: `GET /v1/models without key (controller)`).
LOOPBACK, CONTROLLER = "loopback", "controller"
_BY_CONTROLLER = " (from the controller): "
GATEWAY_PROBE = "gateway-probe"
CONFIG_HASH = "config-hash"  # compose gave no config hashes: its pending recreates not judged


def probe_sides(texts: Iterable[Any] | None) -> frozenset[str] | None:
    """Whose probes (LOOPBACK, CONTROLLER) a box's gateway-probe faults are, read from its
    faults' texts; None when not known (no texts: a report that could not be read)."""
    if texts is None:
        return None
    out: set[str] = set()
    for text in texts:
        if not isinstance(text, str):
            return None
        if _by_controller(text) or text.startswith("controller probes"):
            out.add(CONTROLLER)  # its probes, or its record of them (compare/box.py)
            continue
        part = part_of(text)
        if part is None:
            return None  # a fault naming no part: whose probe it may be is not known
        if part == GATEWAY_PROBE:
            out.add(LOOPBACK)
    return frozenset(out)


def probes_of(
    faults: dict[str, tuple[str, ...] | None], texts: dict[Any, Any]
) -> dict[str, frozenset[str] | None]:
    """`probe_sides` of each box with a gateway-probe fault, from its faults' `texts` (by box):
    what a diff's Side keeps, for a stored run and for a judged snapshot alike."""
    return {
        box: probe_sides(texts.get(box))
        for box, parts in faults.items()
        if GATEWAY_PROBE in (parts or ())
    }


def _by_controller(text: str) -> bool:
    """`gateway <probe> (from the controller): ...` (a string test: this module is imported on
    every drift run, which compiles no regex it does not use)."""
    head, found, _ = text.partition(_BY_CONTROLLER)
    probe = head.removeprefix("gateway ")
    return bool(found) and probe != head and probe.replace("_", "a").isalpha() and probe.islower()


def probe_of(path: str) -> str | None:
    """The probe an entry's path says saw it (LOOPBACK, CONTROLLER), or None (most entries)."""
    for side in (LOOPBACK, CONTROLLER):
        if path.endswith(f"({side})"):
            return side
    return None


def column(subject: str) -> str:
    """The column an entry's subject falls in (html.column_of), every lane as LANES."""
    from reconciler.report.html import column_of

    found = column_of(subject)
    return found if found in (GATEWAY, BOX_WIDE) else LANES


def complete(
    observation: str, errors: int, faults: Sequence[str] | None, texts: Sequence[Any] | None = None
) -> bool:
    """Whether a stored box's entry count is the whole of its drift: observed in full, and no
    fault left a column not observed (`texts`: its report's errors, for a run recorded before
    the parts were kept; known's rule)."""
    return observation == "full" and not unseen_columns(known(errors, faults, texts))


def seen_in_full(box: Any) -> bool:
    """The same of a run's box (compare.drift.BoxResult): what the HTML page's badge and its
    sparkline's last point go by."""
    from reconciler.report.html import unobserved

    return bool(box.observation == "full" and not unobserved(box))


def words(columns: Iterable[str]) -> str:
    """`the lanes and the gateway`, as a reason names columns, in a fixed order."""
    found = [word for col, word in _WORDS.items() if col in set(columns)]
    return " and ".join([", ".join(found[:-1]), found[-1]] if len(found) > 1 else found)
