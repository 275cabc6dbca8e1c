"""`reconcile apply | rollback | snapshots`: registered by reconciler/cli.py's build_parser().

`apply` prints the drift, asks (unless --yes), converges through pyinfra's API with the same
role `pyinfra inventory.py deploys/<box>.py` runs (roles.box.converge_box), and writes one
evidence record per box. Exit codes: 0 converged (or nothing to do), 1 a box failed or could
not be converged, 2 declined at the prompt (the drift stays). `--dry` answers as `drift` does:
0 nothing to converge, 2 a plan would change something, 1 a box cannot be converged.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reconciler.arg_types import file_path
from reconciler.cli import _boxes

if TYPE_CHECKING:
    from reconciler.desired.fleet import Fleet

EXIT_OK, EXIT_ERROR, EXIT_DECLINED = 0, 1, 2
EXIT_WOULD_CHANGE = 2  # `--dry` with a plan: a CI gate on it fires, as on `drift`'s 2
EVIDENCE_ENV = "FLEET_EVIDENCE_DIR"


def register(sub: Any, load: Any) -> None:
    """Add the commands to `reconcile`'s subparsers; `load(args)` returns the Fleet."""

    def add(name: str, handler: Any, help_text: str, description: str) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = sub.add_parser(name, help=help_text, description=description)
        p.set_defaults(handler=lambda args: handler(args, _judging_secrets(load(args))))
        return p

    apply_p = add(
        "apply",
        _cmd_apply,
        "converge boxes to the desired state (pyinfra), verify, roll back on failure",
        "Observe each box, print its drift and the plan, ask unless --yes, then converge it "
        "through pyinfra (the same role as `pyinfra inventory.py deploys/<box>.py`): lock, "
        "snapshot, .env, compose files, images by digest, lanes one at a time, gateway last; "
        "verify zero drift or roll back. Boxes go one at a time, a role's host first. "
        "Writes an evidence record (JSON, secrets hashed) per box.",
    )
    apply_p.add_argument("boxes", nargs="*", metavar="BOX", help="boxes (default: all)")
    apply_p.add_argument("-y", "--yes", action="store_true", help="do not ask")
    apply_p.add_argument(
        "--dry",
        action="store_true",
        help="print drift and plan, change nothing; exit 2 if a plan would change something",
    )
    apply_p.add_argument(
        "--accept-interrupted",
        action="store_true",
        help="converge even though the box's previous converge was killed half way (without "
        "it the box refuses, naming that converge's snapshot: roll back to it instead with "
        "`reconcile rollback BOX --to SNAPSHOT`)",
    )
    apply_p.add_argument(
        "--evidence",
        metavar="DIR",
        type=file_path,
        # Not the variable here: argparse would judge an empty one as if `--evidence ""` had
        # been typed. It is read, and an empty one refused by its own name, in _evidence_dir.
        default=None,
        help=f"where evidence records go (default: ${EVIDENCE_ENV} or ./evidence)",
    )
    rollback_p = add(
        "rollback",
        _cmd_rollback,
        "restore a box's snapshot (files, then the services whose config differs)",
        "Restore the .env and compose files of a snapshot byte for byte, recreate every "
        "service whose config then differs from its container (scrubbed environment), wait "
        "for health, and report whether the containers match the snapshot again.",
    )
    rollback_p.add_argument("box", metavar="BOX")
    rollback_p.add_argument("--to", metavar="SNAPSHOT", help="snapshot id (default: the latest)")
    snaps_p = add(
        "snapshots",
        _cmd_snapshots,
        "list a box's converge snapshots and who holds its lock",
        "List the snapshots a converge took on BOX (~/.lobes/.fleet/snapshots), newest last, "
        "with their outcome, and the current holder of the box's converge lock.",
    )
    snaps_p.add_argument("box", metavar="BOX")


def _judging_secrets(fleet: Fleet) -> Fleet:
    """`fleet`, its own `secret_patterns` adopted first, as its drift adopts them: what a box
    says during a rollback or a snapshot listing (`DB_PW=...` under `*_PW`) was printed in
    clear, no drift having run before it."""
    from reconciler.desired.show import adopt_patterns

    adopt_patterns(fleet)
    return fleet


def _cmd_apply(args: argparse.Namespace, fleet: Fleet) -> int:
    from reconciler.apply import session
    from reconciler.apply.engine import holder, prepare
    from reconciler.apply.summary import plan_lines
    from reconciler.drift import run_drift
    from reconciler.observe import fanout
    from reconciler.report import render

    # apply takes neither --timeout nor --max-parallel: the environment's values (or the
    # defaults), not those an earlier command of this process was given.
    fanout.configure()
    problem = fanout.settings_problem()
    if problem:
        # Named before any box is observed, as drift and audit name it: read only once the
        # observation starts, a bad value was a traceback.
        print(f"error: {_line(problem)}; nothing changed", file=sys.stderr)
        return EXIT_ERROR
    boxes = _boxes(list(fleet.boxes), args.boxes)
    if boxes is None:
        return EXIT_ERROR
    session.use(fleet)
    order = [b for b in session.mesh_boxes() if b in boxes]
    run = run_drift(fleet, order)
    sys.stdout.write(render(run.report, "text", width=100))
    prepared = {b: prepare(fleet, b, run) for b in order}
    for prep in prepared.values():
        prep.accept_interrupted = args.accept_interrupted
    for box, prep in prepared.items():
        for line in plan_lines(prep.plan):
            print(f"{box}: plan: {line}")
    blocked = [b for b in order if prepared[b].plan.blocked]
    todo = [b for b in order if not prepared[b].plan.empty]
    if not todo:
        print("nothing to converge" if not blocked else f"cannot converge {', '.join(blocked)}")
        return EXIT_ERROR if blocked else EXIT_OK
    if args.dry:
        return EXIT_ERROR if blocked else EXIT_WOULD_CHANGE
    evidence = _evidence_dir(args.evidence)
    if evidence is None:
        return EXIT_ERROR
    problem = evidence_problem(evidence)
    if problem is not None:
        # Said before the prompt, with nothing changed: a converge's record must have a place.
        print(
            f"error: --evidence {_line(str(evidence))}: {problem}; nothing changed", file=sys.stderr
        )
        return EXIT_ERROR
    if not args.yes and not _confirm(f"converge {', '.join(todo)}?"):
        print("declined: nothing changed")
        return EXIT_DECLINED
    who = holder("reconcile apply")
    session.use(fleet, prepared, cmd="reconcile apply")
    _run_pyinfra(fleet, todo)
    codes = [_report_box(box, evidence, fleet.inventory_file, who) for box in todo]
    return EXIT_ERROR if blocked or EXIT_ERROR in codes else EXIT_OK


def _evidence_dir(given: str | None) -> Path | None:
    """--evidence, else $FLEET_EVIDENCE_DIR, else ./evidence; None (said) for a variable that
    is set but empty, which is a mistake to name, not a reason to write somewhere else."""
    if given is not None:
        return Path(given)
    chosen = os.environ.get(EVIDENCE_ENV)
    if chosen is None:
        return Path("evidence")
    if not chosen.strip():
        print(
            f"error: {EVIDENCE_ENV} is set but empty (unset it for ./evidence, or name a "
            "directory); nothing changed",
            file=sys.stderr,
        )
        return None
    return Path(chosen)


def evidence_problem(directory: Path) -> str | None:
    """Why evidence cannot be written into `directory` (created here if missing), or None.

    Checked by doing it: the directory is made and a file created in it and removed, since
    what stat or access(2) say is not what a write meets (`/proc/x` passes both as root)."""
    import tempfile

    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=directory):
            pass
    except OSError as exc:
        return exc.strerror or str(exc)
    return None


def _report_box(box: str, directory: Path, inventory: str, who: str) -> int:
    """One box's outcome on the terminal and its evidence record; its exit code."""
    from reconciler.apply import session
    from reconciler.apply.evidence import write

    out = session.outcomes.get(box)
    if out is None:
        print(f"{box}: not converged (pyinfra did not run it)", file=sys.stderr)
        return EXIT_ERROR
    state = "converged" if out.ok else "STATE UNKNOWN" if out.state_unknown else "FAILED"
    try:
        path = write(directory, out, inventory, who)
    except OSError as exc:
        why = _line(exc.strerror or exc)
        print(f"{box}: {state}; evidence NOT written to {_line(directory)}: {why}", file=sys.stderr)
        return EXIT_ERROR
    print(f"{box}: {state}; evidence {path}")
    return EXIT_OK if out.ok else EXIT_ERROR


def _confirm(question: str) -> bool:
    if not sys.stdin.isatty():
        print(f"{question} refusing without a terminal; pass --yes", file=sys.stderr)
        return False
    return input(f"{question} [y/N] ").strip().lower() in ("y", "yes")


def _run_pyinfra(fleet: Fleet, boxes: list[str]) -> None:
    """The pyinfra API flow (docs/api): inventory from the fleet, connect, add the role, run."""
    from pyinfra.api import Config, Inventory, State
    from pyinfra.api.connect import connect_all
    from pyinfra.api.deploy import add_deploy
    from pyinfra.api.exceptions import PyinfraError
    from pyinfra.api.operations import run_ops

    from reconciler.desired.pyinfra_data import host_data
    from roles.box import converge_in_order

    root = {"fleet_root": str(fleet.root)}  # as inventory.py says it
    hosts = [(f"@openssh/{b}", host_data(fleet, b) | root) for b in boxes]
    inventory = Inventory((hosts, {}))
    state = State(inventory, Config())
    try:
        connect_all(state)
        # One operation per box at its place in `boxes` (mesh order: a role's host first);
        # pyinfra's default run takes one operation at a time, so one box at a time. (Its
        # serial mode would go host by host in the order of a set.)
        add_deploy(state, converge_in_order, boxes)
        run_ops(state)
    except PyinfraError as exc:
        # pyinfra stops once no host is left ("No hosts remaining!": every box failed or could
        # not be reached). Each box's outcome is still reported and recorded by the caller; a
        # box pyinfra never ran has none and reads as not converged.
        print(f"pyinfra stopped: {_line(exc)}", file=sys.stderr)


def _cmd_rollback(args: argparse.Namespace, fleet: Fleet) -> int:
    from reconciler.apply.answer import rollback_result
    from reconciler.apply.engine import holder, rollback
    from reconciler.apply.progress import Reporter
    from reconciler.apply.summary import aside_words
    from reconciler.scrub import scrub_text

    if _boxes(list(fleet.boxes), [args.box]) is None:
        return EXIT_ERROR
    if args.to is not None and not _is_snapshot_of(fleet, args.box, args.to):
        return EXIT_ERROR
    reporter = Reporter(args.box)
    try:
        call = rollback(fleet, args.box, args.to, holder("reconcile rollback"), reporter.on_event)
    finally:
        reporter.close()
    result = rollback_result(call.result)
    if call.may_have_run:
        # No result came, and nothing proves the program never ran (boxcall.BoxCall's rule):
        # it outlives a dropped connection (it ignores SIGHUP) and may still be restoring files
        # and recreating lanes under its lock.
        lost = scrub_text(str(call.result.get("failed") or "no result"))
        print(
            f"{args.box}: rollback failed: {_line(lost)}; STATE UNKNOWN: the box may still be "
            f"rolling back; once `reconcile snapshots {args.box}` shows no lock, check it with "
            f"`reconcile drift {args.box}` or run the rollback again",
            file=sys.stderr,
        )
        return EXIT_ERROR
    if result is None or not result.ok:
        why = result.failed if result else "the box program gave no rollback result"
        print(f"{args.box}: rollback failed: {_line(why)}", file=sys.stderr)
        return EXIT_ERROR
    equal = (
        "containers match the snapshot"
        if result.config_equal
        else ("containers differ from the snapshot: " + ", ".join(result.unequal))
    )
    files = ", ".join(result.restored) or ("files already equal" if not result.removed else "")
    files = "; ".join(x for x in (files, _removed_text(result.removed)) if x)
    print(_line(f"{args.box}: rolled back to {result.snapshot}: {files}; {equal}"))
    if result.removed:
        where = f"{fleet.boxes[args.box].deployment.directory}/.fleet/snapshots/{result.snapshot}"
        # True to the box's rule (converge.py prune): they go with their snapshot, once a
        # converge prunes it (the newest `keep` and the newest applied one stay).
        print(
            _line(
                f"{args.box}: the removed files are kept in {where}/removed/ until that "
                "snapshot is pruned"
            )
        )
    if result.removed_containers:
        gone = ", ".join(result.removed_containers)
        print(_line(f"{args.box}: removed the containers of {gone} (created since the snapshot)"))
    if result.started:
        again = ", ".join(result.started)
        print(
            _line(
                f"{args.box}: started again the stopped containers of {again} (a converge had "
                "stopped them to remove)"
            )
        )
    for kept in result.kept:
        # A file the snapshot did not have, left in place on purpose: never an operator's file
        # removed. Said on stderr, as a warning: the files are not all as in the snapshot.
        print(_line(f"{args.box}: KEPT {kept.name}, not removed: {kept.why}"), file=sys.stderr)
    for aside in result.set_aside:
        # Edited by hand since the snapshot: restored over, its edit copied aside first.
        print(_line(f"{args.box}: SET ASIDE {aside.name}: {aside_words(result)}"), file=sys.stderr)
    # A kept file does not fail the rollback: keeping it is the rule, and said above; the exit
    # code still says whether the containers are as in the snapshot.
    return EXIT_OK if result.config_equal else EXIT_ERROR


def _removed_text(removed: tuple[str, ...]) -> str:
    """The files a rollback removed: absent at the snapshot, created by a converge since."""
    return f"removed {', '.join(removed)} (created since the snapshot)" if removed else ""


def _is_snapshot_of(fleet: Fleet, box: str, snapshot: str) -> bool:
    """`--to` names one of BOX's own snapshots: a snapshot id (checked before anything is sent)
    that BOX lists. The box checks both again under its lock."""
    from reconciler.apply.answer import snapshot_listing
    from reconciler.apply.engine import holder, snapshots
    from reconciler.apply.payload import BadPayload, check_snapshot_id

    try:
        check_snapshot_id(snapshot)
    except BadPayload as exc:
        print(f"{box}: {exc}; nothing was sent", file=sys.stderr)
        return False
    listed = snapshot_listing(snapshots(fleet, box, holder("reconcile rollback")).result)
    if not listed.ok:
        print(f"{box}: cannot list its snapshots: {_line(listed.failed)}", file=sys.stderr)
        return False
    if snapshot not in [s.id for s in listed.snapshots]:
        print(
            f"{box}: no snapshot {snapshot} on this box (`reconcile snapshots {box}` lists them); "
            "nothing was changed",
            file=sys.stderr,
        )
        return False
    return True


def _line(value: Any) -> str:
    """A box's message as one printable line: a hostile box cannot drive the terminal."""
    return "".join(ch if ch.isprintable() else " " for ch in str(value))[:500]


def _cmd_snapshots(args: argparse.Namespace, fleet: Fleet) -> int:
    from reconciler.apply.answer import snapshot_listing
    from reconciler.apply.engine import holder, snapshots

    if _boxes(list(fleet.boxes), [args.box]) is None:
        return EXIT_ERROR
    listed = snapshot_listing(snapshots(fleet, args.box, holder("reconcile snapshots")).result)
    if not listed.ok:
        print(f"{args.box}: {_line(listed.failed)}", file=sys.stderr)
        return EXIT_ERROR
    lock = listed.lock
    for snap in listed.snapshots:
        services = ", ".join(snap.services) or "-"
        status = snap.status or "?"
        if status == "running" and not lock:
            # Its converge was killed half way: the next converge refuses until it is rolled
            # back to, or `apply --accept-interrupted` converges over it.
            status = "interrupted"
        print(_line(f"{snap.id}  {status:<15} {services}  ({snap.holder})"))
        if snap.failed:
            print(_line(f"    failed: {snap.failed}"))
    if not listed.snapshots:
        print(f"{args.box}: no snapshots")
    if lock:
        print(_line(f"lock held by {lock.holder} (pid {lock.pid}) since {lock.since}"))
    return EXIT_OK
