"""Load the fleet repository: inventory + group_vars -> validated, merged desired state.

Every problem in every file is collected before anything is reported, so one run lists them
all; any problem raises DesiredStateError and the caller writes nothing.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from reconciler.desired.checks import check_box, check_fleet
from reconciler.desired.envfile import MeshSeeds, desired_env
from reconciler.desired.explain import explain
from reconciler.desired.facts import with_facts
from reconciler.desired.fingerprint import InputsRead, layer_listing
from reconciler.desired.fleet import DerivedEnvs, Fleet
from reconciler.desired.locate import inventory_file, root_or_none
from reconciler.desired.merge import SharedPrefixes
from reconciler.desired.models import BoxSpec, InventoryBox, InventorySpec
from reconciler.desired.near import hint_budget, nearest
from reconciler.desired.problems import DesiredStateError, Location, PathKey, Problem, dotted
from reconciler.desired.refs import is_digest_ref
from reconciler.desired.secret_names import union_layers
from reconciler.desired.yaml_source import SourceDoc, load_yaml
from reconciler.gc_pause import young_only


def find_root(start: Path | None = None) -> Path:
    """The repository root: $FLEET_ROOT, else the nearest parent with inventory/ and group_vars/."""
    root = root_or_none(start)
    if root is None:
        here = str((start or Path.cwd()).resolve())
        raise DesiredStateError(
            [
                Problem(
                    Location(here, 1, 1),
                    "",
                    "no fleet repository here (want inventory/ and group_vars/); set FLEET_ROOT",
                )
            ]
        )
    return root


def load_fleet(
    root: Path | None = None, inventory: str | None = None, facts: Path | None = None
) -> Fleet:
    """`facts`: a saved snapshot's facts/, read instead of the overlays the inventory names."""
    # Each box's layers, merged data and model are kept to the end: the collector's older
    # passes would walk them again and again for no garbage (reconciler/gc_pause.py).
    with young_only(), hint_budget():
        return _load_fleet(root, inventory, facts)


def _load_fleet(root: Path | None, inventory: str | None, facts: Path | None) -> Fleet:
    root = root or find_root()
    inv_path = inventory_file(root, inventory)
    listing = layer_listing(root)  # before any layer is read: one added later is not in this state
    inv_doc = _load(root, inv_path)
    inv = _validate(InventorySpec, inv_doc.data, inv_doc.positions)
    if facts is not None:
        inv = with_facts(inv, facts)  # every overlay read from the snapshot's facts/ instead
    problems = list(_group_membership(inv, inv_doc))

    docs, more = _load_group_vars(root, inv)
    problems += more
    overlay, more = _image_overlay(root, inv, inv_doc)
    problems += more
    if problems:
        raise DesiredStateError(problems)

    boxes: dict[str, BoxSpec] = {}
    positions: dict[str, dict[PathKey, Location]] = {}
    layers: dict[str, tuple[str, ...]] = {}
    box_overlays, more = _box_overlays(root, inv, inv_doc)
    if more:
        raise DesiredStateError(more)
    overlays = [*([overlay] if overlay is not None else []), *box_overlays.values()]
    parsed = [*docs.values(), *overlays]  # every layer read, used by a box or not
    problems += _layer_problems(parsed)
    if problems:
        raise DesiredStateError(problems)
    hidden = frozenset(doc.file for doc in overlays)  # their values are never quoted
    merges = SharedPrefixes()
    for name, conn in inv.boxes.items():
        groups = [docs[n] for n in ("all", *_ordered_groups(inv, conn)) if n in docs]
        chain = [*groups, *([docs[name]] if name in docs else [])]
        if overlay is not None:
            chain.append(overlay)
        if name in box_overlays:
            chain.append(box_overlays[name])
        data, where = merges.merge(chain, len(groups))
        union_layers(chain, data, where)  # secret_patterns: a layer only adds names
        data = {"name": name, **data}  # no layer sets `name` (_layer_problems)
        where.setdefault(("name",), Location(inv_doc.file, 1, 1))
        positions[name] = where
        layers[name] = tuple(doc.file for doc in chain)
        try:
            boxes[name] = BoxSpec.model_validate(data)
        except ValidationError as exc:
            problems += explain(exc, BoxSpec, data, where, hidden_files=hidden)
    if problems:
        raise DesiredStateError(problems)

    mesh = MeshSeeds.of(inv.boxes, [b for b in boxes.values() if b.mesh.enabled])
    envs = {name: desired_env(box, inv.boxes, mesh) for name, box in boxes.items()}
    for name, box in boxes.items():
        for path, message in check_box(box, envs[name]):
            problems.append(_problem(positions[name], path, message))
    for path, message in check_fleet(boxes):
        problems.append(_problem(positions[str(path[0])], path[1:], message))
    if problems:
        raise DesiredStateError(problems)
    # Every file parsed is an input, also a layer no box uses: it was judged, so an edit that
    # makes it invalid must not be served from a cache that never looked at it.
    read = {str(inv_path): inv_doc.read, **{str(root / doc.file): doc.read for doc in parsed}}
    inputs = sorted(Path(path) for path in read)
    seen = InputsRead(listing, {path: r for path, r in read.items() if r is not None})
    derived = DerivedEnvs(boxes, inv, envs)
    return Fleet(root, inv_doc.file, inv, boxes, layers, positions, tuple(inputs), seen, derived)


def _layer_problems(docs: list[SourceDoc]) -> list[Problem]:
    """What no layer may hold whatever the box: a `name` (the inventory names a box: a layer's
    would rename every box using it) and an `env:` number that reaches `.env` as other text
    than it is written (`0022` as 22)."""
    problems = []
    for doc in docs:
        if "name" in doc.data:
            problems.append(Problem(doc.positions[("name",)], "name", _NAMED))
        for path in doc.rewritten:
            if _is_env_value(path):
                problems.append(Problem(doc.positions[path], dotted(path), _REWRITTEN))
    return problems


_NAMED = "a layer cannot set name: the inventory names each box (its key under boxes:)"
_REWRITTEN = (
    "read as a number or boolean, this reaches .env as other text than it is written (0022 "
    "as 22, 1_000 as 1000, 0x10 as 16, 1e3 as 1000.0, TRUE as true): quote it to keep the text"
)


def _is_env_value(path: PathKey) -> bool:
    """`env.KEY` or `lanes.LANE.env.KEY`: the values written to `.env` as text."""
    return (len(path) == 2 and path[0] == "env") or (
        len(path) == 4 and path[0] == "lanes" and path[2] == "env"
    )


def _problem(where: dict[PathKey, Location], path: PathKey, message: str) -> Problem:
    for end in range(len(path), -1, -1):
        if path[:end] in where:
            return Problem(where[path[:end]], dotted(path), message)
    return Problem(where[()], dotted(path), message)


def _display(root: Path, path: Path) -> str:
    """The name errors give a file: relative to the repository, the link's own name for a
    symlink (never resolved: a loop must not raise), non-printable characters escaped."""
    absolute, inside = os.path.abspath(path), os.path.join(os.path.abspath(root), "")
    shown = absolute.removeprefix(inside) if absolute.startswith(inside) else absolute
    if shown.isprintable():  # string work, not pathlib's: called for each of 2,006 files
        return shown
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in shown)


def _load(root: Path, path: Path) -> SourceDoc:
    expected = "a mapping with `boxes:` (and `group_order:`)"
    return load_yaml(path, _display(root, path), within=root, required=expected, inventory=True)


def _validate(model: Any, data: Any, positions: dict[PathKey, Location]) -> Any:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise DesiredStateError(explain(exc, model, data, positions)) from None


def _ordered_groups(inv: InventorySpec, box: InventoryBox) -> list[str]:
    mine = set(box.groups)  # sets: a file naming thousands of groups stays linear
    return [g for g in inv.group_order if g in mine]


def _group_membership(inv: InventorySpec, doc: SourceDoc) -> list[Problem]:
    problems = []
    known = set(inv.group_order)
    for name, box in inv.boxes.items():
        for index, group in enumerate(box.groups):
            if group not in known:
                path = ("boxes", name, "groups", index)
                near = nearest(group, inv.group_order)
                hint = f"; did you mean {near!r}?" if near else ""
                problems.append(
                    Problem(
                        doc.positions.get(path, doc.positions[()]),
                        dotted(path),
                        f"group {group!r} is not in group_order{hint}",
                    )
                )
    return problems


def _load_group_vars(root: Path, inv: InventorySpec) -> tuple[dict[str, SourceDoc], list[Problem]]:
    known = ["all", *inv.group_order, *inv.boxes]
    docs: dict[str, SourceDoc] = {}
    problems: list[Problem] = []
    folder = root / "group_vars"
    for path in sorted([*folder.glob("*.yaml"), *folder.glob("*.yml")]):
        display = _display(root, path)
        if path.stem not in known:
            near = nearest(path.stem, known)
            hint = f"; did you mean {near}.yaml?" if near else ""
            problems.append(
                Problem(
                    Location(display, 1, 1), "", f"no box or group is named {path.stem!r}{hint}"
                )
            )
            continue
        if path.stem in docs:
            problems.append(Problem(Location(display, 1, 1), "", "both .yaml and .yml exist"))
            continue
        try:
            docs[path.stem] = load_yaml(path, display, within=root)
        except DesiredStateError as exc:
            problems += exc.problems
    return docs, problems


def _box_overlays(
    root: Path, inv: InventorySpec, inv_doc: SourceDoc
) -> tuple[dict[str, SourceDoc], list[Problem]]:
    """Per-box last layers (the lab writes the digests of the deployment it rendered)."""
    if inv.box_overlay is None:
        return {}, []
    at = inv_doc.positions.get(("box_overlay",), inv_doc.positions[()])
    docs, problems = {}, []
    for name in inv.boxes:
        path = Path(inv.box_overlay.replace("{box}", name))
        path = path if path.is_absolute() else root / path
        if not os.path.lexists(path):  # anything else there is load_yaml's located error
            hint = " (run `reconcile lab up` first)" if ".lab" in str(path) else ""
            problems.append(
                Problem(at, "box_overlay", f"{_display(root, path)} does not exist{hint}")
            )
            continue
        try:
            docs[name] = load_yaml(path, _display(root, path), within=root)
        except DesiredStateError as exc:
            problems += exc.problems
    return docs, problems


def _image_overlay(
    root: Path, inv: InventorySpec, inv_doc: SourceDoc
) -> tuple[SourceDoc | None, list[Problem]]:
    """The lab's registry digests replace the catalog's, as the last layer of every box."""
    if inv.image_overlay is None:
        return None, []
    path = Path(inv.image_overlay)
    path = path if path.is_absolute() else root / path
    at = inv_doc.positions.get(("image_overlay",), inv_doc.positions[()])
    if not os.path.lexists(path):  # anything else there is load_yaml's located error
        hint = " (run `reconcile lab up` first)" if ".lab" in str(path) else ""
        return None, [Problem(at, "image_overlay", f"{inv.image_overlay} does not exist{hint}")]
    doc = load_yaml(path, _display(root, path), within=root)
    problems = []
    for name, ref in doc.data.items():
        if not isinstance(ref, str) or not is_digest_ref(ref):
            # Never the value: a wrong file named here (a registry's credentials) must not
            # reach a terminal or a CI log through its error.
            message = (
                f"expected an image reference pinned by digest (repo@sha256:<64 hex>), got "
                f"{_shape(ref)} (an overlay's values are not shown)"
            )
            problems.append(Problem(doc.positions[(name,)], name, message))
    images = {"images": doc.data}
    shifted = {("images", *p): loc for p, loc in doc.positions.items()}
    shifted[()] = doc.positions[()]
    shifted[("images",)] = doc.positions[()]
    return SourceDoc(doc.file, images, shifted, doc.read), problems


def _shape(value: Any) -> str:
    """What kind of value was found, never the value."""
    if isinstance(value, str):
        return "a text that is not one"
    kinds = {bool: "a boolean", int: "an integer", float: "a number", dict: "a mapping"}
    kinds |= {tuple: "a list", type(None): "null"}
    return kinds.get(type(value), "a value of another kind")
