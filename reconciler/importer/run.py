"""`reconcile import`: observations -> adopted trees -> layers -> a checked repository -> a
report of what was adopted and what was found while importing."""

from __future__ import annotations

import argparse
import os
import sys
from datetime import UTC, datetime
from pathlib import Path

from pydantic import ValidationError

from reconciler.desired.explain import explain
from reconciler.desired.load import find_root
from reconciler.desired.locate import inventory_file
from reconciler.desired.models import InventorySpec
from reconciler.desired.problems import DesiredStateError
from reconciler.desired.types import url_host
from reconciler.desired.yaml_source import load_yaml
from reconciler.importer import observations as observing
from reconciler.importer.adopt import adopt_box, summary
from reconciler.importer.factor import factor
from reconciler.importer.images import catalog, running_digest
from reconciler.importer.inventory import copied_inventory
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
from reconciler.report.values import clean


def _inventory(root: Path, path: Path) -> InventorySpec:
    doc = load_yaml(path, os.path.relpath(path, root), within=root, inventory=True)
    try:
        return InventorySpec.model_validate(doc.data)
    except ValidationError as exc:
        raise DesiredStateError(explain(exc, InventorySpec, doc.data, doc.positions)) from None


def _origins(
    inv: InventorySpec, trees: dict[str, Tree], obs: dict[str, BoxObservation]
) -> dict[str, str]:
    """Boxes whose `.env` announces another GATEWAY_SELF_ORIGIN than the default one."""
    out = {}
    for name, tree in trees.items():
        doc = obs[name].document
        line = doc.envfile_by_key().get("GATEWAY_SELF_ORIGIN") if doc else None
        if line is None or not isinstance(line.value, str) or not line.value:
            continue
        port_leaf = tree.get("gateway", {}).get("port")
        port = port_leaf.value if isinstance(port_leaf, Sourced) else 8000
        default = f"http://{url_host(inv.boxes[name].ssh_hostname)}:{port}"
        if line.value != default:
            out[name] = line.value
    return out


def adopt(
    root: Path,
    inv_path: Path,
    inv: InventorySpec,
    obs: dict[str, BoxObservation],
    output: Path,
    force: bool,
    came_from: str,
    live: bool,
) -> Imported:
    docs = {b: o.document for b, o in obs.items() if o.document is not None}
    refs = [running_digest(d, c) for d in docs.values() for c in d.containers]
    names = catalog(r for r in refs if r)
    trees: dict[str, Tree] = {}
    findings: list[Finding] = []
    for name, doc in docs.items():
        trees[name], view = adopt_box(name, doc, names, set(docs))
        findings += view.findings
    groups = {b: inv.boxes[b].groups for b in trees}
    layers = factor(trees, groups, inv.group_order)
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    header = (
        f"{WRITTEN_BY} from {came_from} ({', '.join(trees)}), {when}.\n"
        "Each value's comment says where it was found: .env:LINE, docker inspect, GET\n"
        "/capabilities, GET /v1/models, or a policy default no box can show."
    )
    inv_name = (
        os.path.relpath(inv_path, root)
        if inv_path.parent == root / "inventory"
        else f"inventory/{inv_path.name}"
    )
    files = {inv_name: copied_inventory(inv_path, root, trees, _origins(inv, trees, obs))}
    for layer, tree in layers.items():
        files[f"group_vars/{layer}.yaml"] = dump_layer(tree, f"group_vars/{layer}.yaml: {header}")
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
    return Imported(output, sorted(files), lines, findings, results, expected, snapshot=not live)


def run_import(args: argparse.Namespace) -> int:
    root = Path(os.path.realpath(args.root)) if getattr(args, "root", None) else find_root()
    inv_path = inventory_file(root, getattr(args, "inventory", None))
    output = Path(os.path.abspath(args.output))
    force = bool(getattr(args, "force", False))
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
    wanted = list(getattr(args, "boxes", None) or [])
    unknown = [b for b in wanted if b not in inv.boxes]
    if unknown:
        print(f"error: unknown box {unknown[0]!r} (boxes: {', '.join(inv.boxes)})", file=sys.stderr)
        return EXIT_ERROR
    try:
        if snapshot:
            obs = observing.from_snapshot(Path(snapshot), wanted or list(inv.boxes))
            came_from = f"the snapshot {clean(str(snapshot))}"
        else:
            obs = observing.live(root, inv, wanted or list(inv.boxes))
            came_from = "the live boxes"
    except (OSError, ValueError) as exc:
        print(f"error: {clean(str(exc))}", file=sys.stderr)
        return EXIT_ERROR
    missing = [b for b in (wanted or list(inv.boxes)) if b not in obs]
    if missing:
        _refuse_missing(missing, list(obs), named=bool(wanted))
        return EXIT_ERROR
    failed = {b: o for b, o in obs.items() if o.document is None}
    if failed or not obs:
        for name, o in failed.items():
            print(f"error: {name} not observed: {o.failure or o.error}", file=sys.stderr)
        if not obs:
            print("error: no box to adopt", file=sys.stderr)
        print("nothing written", file=sys.stderr)
        return EXIT_ERROR
    try:
        done = adopt(root, inv_path, inv, obs, output, force, came_from, live=not snapshot)
    except OutputRefused as exc:
        print(f"error: --output {exc}; nothing written", file=sys.stderr)
        return EXIT_ERROR
    except DesiredStateError as exc:
        for problem in exc.problems:
            print(problem, file=sys.stderr)
        print(
            "error: the adopted state does not validate (built in a temporary directory, now "
            "removed); nothing written",
            file=sys.stderr,
        )
        return EXIT_ERROR
    from reconciler.importer.report import print_report

    return print_report(done, inv_name_hint(inv_path), snapshot)


def _refuse_missing(missing: list[str], held: list[str], named: bool) -> None:
    """Boxes of the inventory (or named) that the snapshot does not hold: adopting the rest
    alone would drop them from the adopted inventory and from the mesh's members without a
    word, so the import refuses, as for a box not observed, naming each."""
    for name in missing:
        print(f"error: {name} not in the snapshot", file=sys.stderr)
    if not named and held:
        print(
            f"the snapshot holds {', '.join(held)}: to adopt only those, name them "
            f"(`import {' '.join(held)} --from-snapshot ...`)",
            file=sys.stderr,
        )
    print("nothing written", file=sys.stderr)


def inv_name_hint(inv_path: Path) -> str:
    return inv_path.stem
