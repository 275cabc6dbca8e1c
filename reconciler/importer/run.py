"""`reconcile import`: observations -> adopted trees -> layers -> a checked repository -> a
report of what was adopted and what was found while importing."""

from __future__ import annotations

import argparse
import os
import sys
from datetime import UTC, datetime
from pathlib import Path

from pydantic import ValidationError

from reconciler.compare.box import Replayed, misplaced
from reconciler.desired import secret_names
from reconciler.desired.explain import explain
from reconciler.desired.load import find_root, load_fleet
from reconciler.desired.locate import inventory_file
from reconciler.desired.models import InventorySpec
from reconciler.desired.problems import DesiredStateError
from reconciler.desired.types import check_origin, url_host
from reconciler.desired.yaml_source import load_yaml
from reconciler.importer import observations as observing
from reconciler.importer.adopt import adopt_box, home_path, summary
from reconciler.importer.contract import unhosted
from reconciler.importer.factor import factor
from reconciler.importer.images import catalog, running_digest
from reconciler.importer.inventory import Inventory
from reconciler.importer.policy import NO_PATTERNS, OwnPatterns, own_patterns
from reconciler.importer.result import EXIT_ERROR, Imported
from reconciler.importer.sourced import Finding, Sourced, Tree
from reconciler.importer.verify import observed_again, replayed
from reconciler.importer.write import (
    WRITTEN_BY,
    OutputExists,
    OutputRefused,
    build,
    check_free,
    discard,
    put_in_place,
)
from reconciler.importer.yaml_out import dump_layer
from reconciler.observe.observe import BoxObservation
from reconciler.report.values import clean, free_text
from reconciler.scrub import scrub_text

# How many boxes a line names before saying how many more (_some).
SHOWN = 5


def _inventory(root: Path, path: Path) -> InventorySpec:
    doc = load_yaml(path, os.path.relpath(path, root), within=root, inventory=True)
    try:
        return InventorySpec.model_validate(doc.data)
    except ValidationError as exc:
        raise DesiredStateError(explain(exc, InventorySpec, doc.data, doc.positions)) from None


def _origins(
    inv: InventorySpec, trees: dict[str, Tree], obs: dict[str, BoxObservation]
) -> tuple[dict[str, str], list[Finding]]:
    """Boxes whose `.env` announces another GATEWAY_SELF_ORIGIN than the default one, and the
    notes of the ones not adopted as written: the inventory's gateway_origin takes only
    `http(s)://HOST[:PORT]` (types.check_origin), so an origin the loader refuses costs the
    box's origin (a converge writes the default), never the whole box; one trailing `/`
    (`http://10.77.0.11:8000/`, which lobes reads alike) is dropped where that is all."""
    out, notes = {}, []
    for name, tree in trees.items():
        doc = obs[name].document
        line = doc.envfile_by_key().get("GATEWAY_SELF_ORIGIN") if doc else None
        if line is None or not isinstance(line.value, str) or not line.value:
            continue
        port_leaf = tree.get("gateway", {}).get("port")
        port = port_leaf.value if isinstance(port_leaf, Sourced) else 8000
        default = f"http://{url_host(inv.boxes[name].ssh_hostname)}:{port}"
        said = f"GATEWAY_SELF_ORIGIN (.env:{line.line})"
        origin = _accepted_origin(line.value)
        if origin is None and line.value.endswith("/"):
            origin = _accepted_origin(line.value[:-1])
            if origin is not None:
                whose = "the inventory's default" if origin == default else "gateway_origin"
                notes.append(
                    Finding(
                        name,
                        f"{said} ends in /: adopted {origin} ({whose}); a converge writes it "
                        "without the /",
                    )
                )
        if origin is None:
            # The value is not quoted: it may carry a password (`http://user:pw@host`).
            notes.append(
                Finding(
                    name,
                    f"{said} is no origin the inventory accepts (http(s)://HOST[:PORT], "
                    f"nothing more): gateway_origin is not adopted; a converge writes {default}",
                )
            )
            continue
        if origin != default:
            out[name] = origin
    return out, notes


def _accepted_origin(value: str) -> str | None:
    """`value` if the loader takes it for a gateway_origin, else None."""
    try:
        return check_origin(value)
    except ValueError:
        return None


def _files(
    root: Path,
    source: Inventory,
    inv: InventorySpec,
    obs: dict[str, BoxObservation],
    came_from: str,
    left_out: dict[str, list[str]],
    alone: bool = False,
    own: OwnPatterns = NO_PATTERNS,
) -> tuple[dict[str, str], dict[str, Tree], list[Finding], str]:
    """The repository adopting the boxes of `obs` (relative path -> text), their trees, the
    findings, and the inventory's name in it. `source`: the inventory, parsed once for every
    repository an import builds. `left_out`: boxes a partial import does not adopt (each
    file's header says which, and why). `alone` (one box, to judge it on its own): its tree in
    its own layer, as the full repository names a box's own values. `own`: the repository's
    own secret patterns (policy.own_patterns), kept in the adopted policy."""
    inv_path = source.source
    docs = {b: o.document for b, o in obs.items() if o.document is not None}
    refs = [running_digest(d, c) for d in docs.values() for c in d.containers]
    names = catalog(r for r in refs if r)
    trees: dict[str, Tree] = {}
    findings: list[Finding] = []
    for name, doc in docs.items():
        trees[name], view = adopt_box(name, doc, names, set(docs), own, obs[name].probes)
        findings += view.findings
    findings += unhosted(trees)  # a role proxied to a member that serves none
    groups = {b: inv.boxes[b].groups for b in trees}
    layers = dict(trees) if alone else factor(trees, groups, inv.group_order)
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    header = (
        f"{WRITTEN_BY} from {came_from} ({', '.join(trees)}), {when}.\n"
        "Each value's comment says where it was found: .env:LINE, docker inspect, GET\n"
        "/capabilities, GET /v1/models, or a policy default no box can show."
    )
    partial = _partial_note(left_out)
    if partial:
        header += "\n" + partial
    inv_name = (
        os.path.relpath(inv_path, root)
        if inv_path.parent == root / "inventory"
        else f"inventory/{inv_path.name}"
    )
    origins, notes = _origins(inv, trees, obs)
    findings += notes
    files = {inv_name: source.copy(trees, origins, partial)}
    for layer, tree in layers.items():
        files[f"group_vars/{layer}.yaml"] = dump_layer(tree, f"group_vars/{layer}.yaml: {header}")
    return files, trees, findings, inv_name


def _partial_note(left_out: dict[str, list[str]]) -> str:
    """What a partial import's files say of the boxes it left out: the repository is not the
    whole mesh, and whoever reads it later (not the operator who saw the import's output)
    must see so."""
    if not left_out:
        return ""
    boxes = ", ".join(f"{b} ({_first(why)})" for b, why in left_out.items())
    return (
        f"PARTIAL (--partial): not adopted, nothing written for them: {boxes}.\n"
        "The mesh's members (LOBES_MESH_SEEDS) lack them: import every box again before a "
        "converge."
    )


def _first(reasons: list[str]) -> str:
    text = " ".join(clean(reasons[0]).split()) if reasons else "failed"
    return text if len(text) <= 80 else text[:77] + "..."


def adopt(
    built: tuple[dict[str, str], dict[str, Tree], list[Finding], str],
    obs: dict[str, BoxObservation],
    output: Path,
    force: bool,
    live: bool,
    left_out: dict[str, list[str]] | None = None,
) -> Imported:
    """`built`: the repository `_files` made of `obs`, checked here and put in place."""
    files, trees, findings, inv_name = built
    building = build(output, files)
    try:
        inventory = str(building / inv_name)
        if live:
            results, expected = observed_again(building, inventory, list(trees))
        else:
            results, expected = replayed(building, inventory, obs)
        put_in_place(building, output, force)
    finally:
        discard(building)
    lines = [summary(name, tree) for name, tree in trees.items()]
    return Imported(
        output, sorted(files), lines, findings, results, expected, snapshot=not live,
        failed=dict(left_out or {}),
    )  # fmt: skip


def invalid_alone(
    root: Path,
    source: Inventory,
    inv: InventorySpec,
    obs: dict[str, BoxObservation],
    output: Path,
    came_from: str,
    findings: list[Finding],
    own: OwnPatterns = NO_PATTERNS,
) -> dict[str, list[str]]:
    """The boxes whose adopted state does not validate on its own, each with the loader's
    problems (`group_vars/BOX.yaml:LINE:COL: key: message`, of a repository built beside
    `output` for that box alone and removed), then what adopting it found (`findings`, of
    the boxes adopted together: `LOBES_PROFILE is not in .env: ...`, the cause in the box's
    terms). A box valid alone but not beside the others (a problem only the mesh as a whole
    has) is no box's: none is blamed for it. Each box's repository holds that box alone (its
    tree, one inventory entry), so judging N boxes costs N boxes' work, not N times the
    fleet's."""
    out: dict[str, list[str]] = {}
    # What adopting each box beside the others found (alone, its contract would name no
    # other member: notes that are not the box's).
    found: dict[str, list[str]] = {}
    for finding in findings:
        found.setdefault(finding.box, []).append(f"found: {finding.what}")
    for name in obs:
        files, _, _, inv_name = _files(
            root, source, inv, {name: obs[name]}, came_from, {}, alone=True, own=own
        )
        building = build(output, files)
        try:
            load_fleet(building, str(building / inv_name))
        except DesiredStateError as exc:
            out[name] = [str(problem) for problem in exc.problems] + found.get(name, [])
        finally:
            discard(building)
    return out


def run_import(args: argparse.Namespace) -> int:
    root = Path(os.path.realpath(args.root)) if getattr(args, "root", None) else find_root()
    inv_path = inventory_file(root, getattr(args, "inventory", None))
    output = Path(os.path.abspath(args.output))
    force = bool(getattr(args, "force", False))
    # `--partial`: adopt the valid boxes and leave out each that fails (exit 1 all the same);
    # without it one failed box refuses the whole import (docs/import.md says why).
    partial = bool(args.partial)
    snapshot = getattr(args, "from_snapshot", None)
    sources = {"the repository": root, "the inventory": inv_path}
    if snapshot:
        sources["the snapshot"] = Path(snapshot)
    try:
        check_free(output, force, sources)
    except OutputExists as exc:
        print(f"error: --output {exc}; nothing written", file=sys.stderr)
        return EXIT_ERROR
    inv = _inventory(root, inv_path)
    # The fleet's own secret patterns, if the repository lists any: adopted before anything is
    # observed or printed (boxview, the reports' scrubbing), sent to the boxes, and written.
    own = own_patterns(root, inv)
    secret_names.adopt_fleet_patterns(own.patterns)
    wanted = list(getattr(args, "boxes", None) or [])
    unknown = [b for b in wanted if b not in inv.boxes]
    if unknown:
        print(f"error: unknown box {unknown[0]!r} (boxes: {', '.join(inv.boxes)})", file=sys.stderr)
        return EXIT_ERROR
    boxes = wanted or list(inv.boxes)
    if not snapshot:
        from reconciler.observe.fanout import settings_problem

        # import has no --timeout or --max-parallel: a bad value can only be the environment's,
        # and is named so, before any box is contacted (as drift and audit name it).
        problem = settings_problem()
        if problem:
            print(f"error: {clean(problem)}", file=sys.stderr)
            return EXIT_ERROR
    try:
        if snapshot:
            obs = observing.from_snapshot(Path(snapshot), boxes)
            came_from = f"the snapshot {clean(str(snapshot))}"
        else:
            obs = observing.live(root, inv, boxes, own.patterns)
            came_from = "the live boxes"
    except (OSError, ValueError) as exc:
        print(f"error: {clean(str(exc))}", file=sys.stderr)
        return EXIT_ERROR
    source = Inventory(inv_path, root)  # parsed once for every repository the import builds
    failed = _not_observed(boxes, obs, snapshot)
    if snapshot:
        failed.update(_observed_elsewhere(source, inv, obs, boxes, failed))
        failed = {b: failed[b] for b in boxes if b in failed}  # named in the inventory's order
    if failed and not partial:
        for name, why in failed.items():
            print(f"error: {name} {why[0]}", file=sys.stderr)
        _refuse_failed(list(failed), [b for b in boxes if b not in failed], snapshot)
        return EXIT_ERROR
    valid = {b: obs[b] for b in boxes if b not in failed}
    if not valid:
        for name, why in failed.items():
            print(f"error: {name} {why[0]}", file=sys.stderr)
        print("error: no box to adopt; nothing written", file=sys.stderr)
        return EXIT_ERROR
    # The inventory parsed once: the repository and, if the whole does not validate, each
    # box's own.
    args_of = (root, source, inv)
    live = not snapshot
    try:
        whole = _files(*args_of, valid, came_from, failed, own=own)
        try:
            done = adopt(whole, valid, output, force, live, failed)
        except DesiredStateError as exc:
            # Only now is each box judged alone, to say whose the problems are.
            invalid = invalid_alone(*args_of, valid, output, came_from, whole[2], own)
            left = [b for b in valid if b not in invalid]
            if not partial or not invalid or not left:
                _refuse_invalid(exc, invalid, left, partial)
                return EXIT_ERROR
            for name, problems in invalid.items():
                failed[name] = ["its adopted state does not validate", *problems]
            valid = {b: valid[b] for b in left}
            rest = _files(*args_of, valid, came_from, failed, own=own)
            done = adopt(rest, valid, output, force, live, failed)
    except OutputRefused as exc:
        print(f"error: --output {exc}; nothing written", file=sys.stderr)
        return EXIT_ERROR
    except DesiredStateError as exc:  # the rest, adopted without the invalid boxes
        _refuse_invalid(exc, {}, [], partial)
        return EXIT_ERROR
    from reconciler.importer.report import print_report

    return print_report(done, inv_name_hint(whole[3]), snapshot)


def _not_observed(
    boxes: list[str], obs: dict[str, BoxObservation], snapshot: str | None
) -> dict[str, list[str]]:
    """Each box with no observation to adopt, and why: the snapshot does not hold it, or it
    was not observed (a box that did not answer, a damaged box file: its file is named)."""
    out: dict[str, list[str]] = {}
    for name in boxes:
        got = obs.get(name)
        if got is None:
            out[name] = ["not in the snapshot"]
        elif got.document is None:
            where = f" ({clean(str(Path(snapshot) / f'{name}.json'))})" if snapshot else ""
            out[name] = [f"not observed: {got.failure or got.error}{where}"]
    return out


def _observed_elsewhere(
    source: Inventory,
    inv: InventorySpec,
    obs: dict[str, BoxObservation],
    boxes: list[str],
    failed: dict[str, list[str]],
) -> dict[str, list[str]]:
    """Each box whose snapshot was observed in another deployment directory or as another
    user than the repository this import writes (the directory it adopts, under the box's
    home: adopt.home_path; the inventory's ssh_user), with both. Its values are another
    deployment's: drift replays the box against the written repository as `misplaced`
    (compare/box.py) and compares nothing, so adopted it would end "adopted, nothing found"
    for a deployment no one observed (a lab snapshot imported with the production inventory).
    Judged by `misplaced` itself, so the import refuses exactly what the replay would not
    compare."""
    out: dict[str, list[str]] = {}
    for name in boxes:
        got = obs.get(name)
        doc = got.document if got is not None and name not in failed else None
        if doc is None:
            continue
        user = inv.boxes[name].ssh_user
        directory = home_path(doc, doc.deploy_dir)
        if misplaced(doc, Replayed(directory, user)) is None:
            continue
        seen = f"{scrub_text(doc.deploy_dir or '?')} as {scrub_text(doc.user or '?')}"
        out[name] = [
            f"was observed in {seen}; the repository this import writes deploys it to "
            f"{directory} as {user} (ssh_user, {source.where(name, 'ssh_user')}): the "
            "snapshot is another deployment's (import it with the inventory it was saved "
            "against, -i)"
        ]
    return out


def _refuse_failed(failed: list[str], held: list[str], snapshot: str | None) -> None:
    """Some boxes cannot be adopted: adopting the rest alone would drop them from the adopted
    inventory and from the mesh's members without a word, so the import refuses, and says the
    two ways on: name the others, or `--partial`."""
    if held:
        source = " --from-snapshot DIR" if snapshot else ""
        print(
            f"{', '.join(failed)}: cannot be imported. To import only {', '.join(held)}, name "
            f"them (`import {' '.join(held)}{source} --output NEWROOT`), or give --partial to "
            "import every valid box and leave out each failed one (exit 1 all the same)",
            file=sys.stderr,
        )
    print("nothing written", file=sys.stderr)


def _refuse_invalid(
    exc: DesiredStateError, invalid: dict[str, list[str]], left: list[str], partial: bool
) -> None:
    """The adopted state does not validate: its problems, then whose they are (`invalid`:
    the boxes whose state fails on its own) and what `--partial` would do."""
    for problem in exc.problems:
        print(problem, file=sys.stderr)
    print(
        "error: the adopted state does not validate (built in a temporary directory, now "
        "removed); nothing written",
        file=sys.stderr,
    )
    for name, reasons in invalid.items():
        print(f"error: {name}: its adopted state does not validate on its own", file=sys.stderr)
        for line in reasons:
            if line.startswith("found: "):  # the problems are printed above
                print(f"  {free_text(line)}", file=sys.stderr)
    if invalid and left and not partial:
        print(
            f"give --partial to import {_some(left)} and leave out {_some(list(invalid))} "
            "(exit 1 all the same)",
            file=sys.stderr,
        )
    elif not invalid:
        print(
            "each box's adopted state validates on its own, the boxes together do not: no box "
            "can be left out (--partial)",
            file=sys.stderr,
        )


def _some(names: list[str]) -> str:
    """The first few names and how many more: one line whatever the fleet's size (each
    failed box was named above, with its reasons)."""
    if len(names) <= SHOWN:
        return ", ".join(names)
    return f"{', '.join(names[:SHOWN])} (and {len(names) - SHOWN} more)"


def inv_name_hint(inv_name: str) -> str:
    """What `-i` selects the written inventory with (`inv_name`: its path in the new
    repository): its name where that is `inventory/NAME.yaml` (locate.inventory_file's
    reading of a name), else that path, which `-i` reads under `--root` (`inventory/mesh.yml`:
    `-i mesh` would select inventory/mesh.yaml, which is not there)."""
    folder, _, name = inv_name.partition("/")
    stem = name.removesuffix(".yaml")
    if folder == "inventory" and stem and stem != name and "/" not in stem:
        return stem
    return inv_name
