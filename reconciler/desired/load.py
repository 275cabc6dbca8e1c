"""Load the fleet repository: inventory + group_vars -> validated, merged desired state.

Every problem in every file is collected before anything is reported, so one run lists them
all; any problem raises DesiredStateError and the caller writes nothing.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from reconciler.desired.checks import check_box, check_fleet
from reconciler.desired.envfile import MeshSeeds, desired_env
from reconciler.desired.explain import explain
from reconciler.desired.facts import with_facts
from reconciler.desired.fingerprint import InputsRead, ignored_entry, layer_listing
from reconciler.desired.fleet import DerivedEnvs, Fleet, resolve_inventory_path
from reconciler.desired.locate import ROOT_ENV, inventory_file, root_or_none
from reconciler.desired.merge import SharedPrefixes
from reconciler.desired.models import BoxSpec, InventoryBox, InventorySpec
from reconciler.desired.near import hint_budget, nearest
from reconciler.desired.problems import (
    DesiredStateError,
    Location,
    PathKey,
    Problem,
    dotted,
    printable,
)
from reconciler.desired.pyinfra_data import RESERVED_GROUPS
from reconciler.desired.refs import is_digest_ref
from reconciler.desired.safe_read import _kind as file_kind
from reconciler.desired.safe_read import climbs
from reconciler.desired.schema import layer_errors
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
    _check_root(root)
    inv_path = inventory_file(root, inventory)
    listing = layer_listing(root)  # before any layer is read: one added later is not in this state
    inv_doc = _load(root, inv_path)
    inv = _validate(InventorySpec, inv_doc.data, inv_doc.positions)
    # The inventory's own overlays, even where a snapshot's facts/ replaces them (chosen by
    # --from-snapshot, read wherever that is): an inventory naming a file out there is wrong.
    problems = _overlay_problems(root, inv_path, inv, inv_doc)
    own_box_overlay = inv.box_overlay  # a box the snapshot's facts do not hold reads its own
    if facts is not None:
        inv = with_facts(inv, facts)  # every overlay read from the snapshot's facts/ instead
    problems += _group_membership(inv, inv_doc)
    problems += _ssh_file_problems(root, inv, inv_doc)

    files: list[tuple[Path, SourceDoc]] = []  # each file parsed, by the path it was read at
    docs, more = _load_group_vars(root, inv, files)
    problems += more
    overlay: SourceDoc | None = None
    if not any(p.path == "image_overlay" for p in problems):  # refused: not read at all
        overlay, more = _image_overlay(root, inv, inv_doc, files)
        problems += more
    if problems:
        raise DesiredStateError(problems)

    boxes: dict[str, BoxSpec] = {}
    positions: dict[str, dict[PathKey, Location]] = {}
    layers: dict[str, tuple[str, ...]] = {}
    box_overlays, more = _box_overlays(root, inv, inv_doc, files, own_box_overlay)
    if more:
        raise DesiredStateError(more)
    overlays = [*([overlay] if overlay is not None else []), *box_overlays.values()]
    parsed = [*docs.values(), *overlays]  # every layer read, used by a box or not
    problems += _layer_problems(parsed)
    if problems:
        raise DesiredStateError(problems)
    problems += _alone_problems(docs)
    # What a layer holds wrong on its own was said once, at its line: a box's merged data
    # holding it too says no more (below, only what the merge adds: a key no layer sets).
    said = {(p.location, p.path) for p in problems}
    found = _BoxProblems(docs, box_overlays, len(inv.boxes))
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
            for problem in explain(exc, BoxSpec, data, where, hidden_files=hidden):
                if (problem.location, problem.path) not in said:
                    found.add(name, problem)
    problems += found.problems()
    if problems:
        raise DesiredStateError(problems)

    mesh = MeshSeeds.of(inv.boxes, [b for b in boxes.values() if b.mesh.enabled])
    envs = {name: desired_env(box, inv.boxes, mesh) for name, box in boxes.items()}
    for name, box in boxes.items():
        for path, message in check_box(box, envs[name]):
            found.add(name, _problem(positions[name], path, message))
    problems += found.problems()
    for path, message in check_fleet(boxes):  # between boxes: its message names them
        problems.append(_problem(positions[str(path[0])], path[1:], message))
    if problems:
        raise DesiredStateError(problems)
    # Every file parsed is an input, also a layer no box uses: it was judged, so an edit that
    # makes it invalid must not be served from a cache that never looked at it. Each by the
    # path it was read at: its shown name (escaped, relative) may name another file.
    read = {str(inv_path): inv_doc.read, **{str(path): doc.read for path, doc in files}}
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


def _alone_problems(docs: dict[str, SourceDoc]) -> list[Problem]:
    """Each group_vars layer on its own against the layer schema (`reconcile schema`: a box's
    keys, none required): a layer no box uses (a group with no member yet), or a value a later
    layer replaces for every box, was never judged, so a typo or an out-of-range value there
    stayed until a box took it. A value is hidden as a box's would be: under a secret-named
    key, by every layer's secret_patterns (a layer's own may name none)."""
    patterns = tuple(p for doc in docs.values() for p in _texts(doc.data.get("secret_patterns")))
    problems = []
    for doc in docs.values():
        exc = layer_errors(doc.data)
        if exc is None:
            continue
        shown = {
            **doc.data,
            "secret_patterns": (*_texts(doc.data.get("secret_patterns")), *patterns),
        }
        problems += explain(exc, BoxSpec, shown, doc.positions)
    return problems


def _texts(value: Any) -> tuple[str, ...]:
    return tuple(v for v in value if isinstance(v, str)) if isinstance(value, list | tuple) else ()


class _BoxProblems:
    """Problems found in boxes' merged data, each naming the boxes it was found in when its line
    is in a layer other than the box's own (all.yaml, a group's, the image overlay):
    `gpu_memory_budget: lanes use 1.13 ...` at all.yaml:57 was one box's, which the line alone
    did not say. The same problem in several boxes is one line naming them, or none if it is
    every box's."""

    def __init__(
        self, docs: dict[str, SourceDoc], overlays: dict[str, SourceDoc], fleet: int
    ) -> None:
        self._own = {
            name: {doc.file for doc in (docs.get(name), overlays.get(name)) if doc is not None}
            for name in {*docs, *overlays}
        }
        self._fleet = fleet
        self._found: dict[Problem, list[str]] = {}

    def add(self, box: str, problem: Problem) -> None:
        boxes = self._found.setdefault(problem, [])
        if problem.location.file not in self._own.get(box, ()):
            boxes.append(box)

    def problems(self) -> list[Problem]:
        """What was added since the last call, each naming its boxes where it needs to (not
        where it is every box's: the line alone says that much)."""
        out = [
            p if not b or len(b) == self._fleet else Problem(p.location, p.path, self._of(p, b))
            for p, b in self._found.items()
        ]
        self._found.clear()
        return out

    @staticmethod
    def _of(problem: Problem, boxes: list[str], shown: int = 12) -> str:
        """`... (box thor)`, `(boxes thor, orin)`, `(boxes a, ..., l and 988 more)`."""
        if len(boxes) == 1:
            return f"{problem.message} (box {boxes[0]})"
        more = f" and {len(boxes) - shown} more" if len(boxes) > shown else ""
        return f"{problem.message} (boxes {', '.join(boxes[:shown])}{more})"


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
    if climbs(path):
        # abspath drops `lnk/..` as text, where the kernel goes up from lnk's target: the
        # file read is in the directory realpath finds (it follows each link before its
        # `..`, and leaves a loop as it is rather than raise). The file keeps its own name.
        folder, name = os.path.split(os.path.join(os.getcwd(), path))
        absolute = os.path.join(os.path.realpath(folder), name)
        inside = os.path.join(os.path.realpath(root), "")
    shown = absolute.removeprefix(inside) if absolute.startswith(inside) else absolute
    return printable(shown)  # string work, not pathlib's: called for each of 2,006 files


def _load(root: Path, path: Path) -> SourceDoc:
    expected = "a mapping with `boxes:` (and `group_order:`)"
    return load_yaml(path, _display(root, path), within=root, required=expected, inventory=True)


def _validate(model: Any, data: Any, positions: dict[PathKey, Location]) -> Any:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise DesiredStateError(explain(exc, model, data, positions)) from None


def _ssh_file_problems(root: Path, inv: InventorySpec, doc: SourceDoc) -> list[Problem]:
    """A key or known_hosts that is there but not a file (a directory: `.lab/ssh` for
    `.lab/ssh/known_hosts`) is refused at its line, as ssh is given it (Fleet.resolve_path).
    Opened by the connection's own code, it stopped every box's pyinfra run with a traceback,
    and drift said only `IsADirectoryError`. A missing file is left to ssh (a key may be made
    after the inventory is written, as the lab does)."""
    problems = []
    for name, box in inv.boxes.items():
        for key in ("ssh_key", "ssh_known_hosts_file"):
            value = getattr(box, key)
            if value is None:
                continue
            path = resolve_inventory_path(root, value)
            try:
                mode = os.stat(path).st_mode  # a symlink to a file is a file to ssh
            except (OSError, ValueError):
                continue
            if not stat.S_ISREG(mode):
                shown = printable(value if path == value else f"{value} ({path})")
                why = f"{shown} {file_kind(mode)}: ssh needs a file here"
                problems.append(_at(doc, ("boxes", name, key), why))
    return problems


def _ordered_groups(inv: InventorySpec, box: InventoryBox) -> list[str]:
    mine = set(box.groups)  # sets: a file naming thousands of groups stays linear
    return [g for g in inv.group_order if g in mine]


def _group_membership(inv: InventorySpec, doc: SourceDoc) -> list[Problem]:
    problems = _group_names(inv, doc)
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


def _group_names(inv: InventorySpec, doc: SourceDoc) -> list[Problem]:
    """What a group's name cannot be. pyinfra sees each group by its name: one named `boxes`
    replaced pyinfra's group of every host with its data (the deploys then ended in a
    traceback), `all` is pyinfra's own (and group_vars/all.yaml every box's first layer), and
    pyinfra's Inventory() takes the others as keyword arguments. A group_vars file is a box's or
    a group's by its name alone: a group listed twice, a box in a group named like itself, or a
    box named `all` applied one layer twice. (A box in a group named like another box takes
    that box's layer: lab/scale.py's copies do, by design.)"""
    problems = []
    seen: set[str] = set()
    for index, group in enumerate(inv.group_order):
        if group in RESERVED_GROUPS:
            why = f"{group!r} is reserved ({_RESERVED}: pyinfra's own names); rename the group"
        elif group in seen:
            why = f"group {group!r} is listed twice: its layer would be applied twice"
        else:
            seen.add(group)
            continue
        problems.append(_at(doc, ("group_order", index), why))
    for name, box in inv.boxes.items():
        if name == "all":
            why = "a box cannot be named 'all': group_vars/all.yaml is every box's first layer"
            problems.append(_at(doc, ("boxes", name), why))
        for index, group in enumerate(box.groups):
            if group == name and group in seen:
                why = (
                    f"box {name!r} is in a group named like itself: group_vars/{name}.yaml "
                    "would be applied twice"
                )
                problems.append(_at(doc, ("boxes", name, "groups", index), why))
    return problems


_RESERVED = ", ".join(sorted(RESERVED_GROUPS))


def _at(doc: SourceDoc, path: PathKey, message: str) -> Problem:
    return Problem(doc.positions.get(path, doc.positions[()]), dotted(path), message)


def _load_group_vars(
    root: Path, inv: InventorySpec, files: list[tuple[Path, SourceDoc]]
) -> tuple[dict[str, SourceDoc], list[Problem]]:
    known = ["all", *inv.group_order, *inv.boxes]
    docs: dict[str, SourceDoc] = {}
    problems: list[Problem] = []
    folder = root / "group_vars"
    for path, is_dir in _entries(root, folder, problems):
        display = _display(root, path)
        stem, dot, ext = path.name.rpartition(".")
        if not dot or ext not in ("yaml", "yml"):  # a directory NAME.yaml: load_yaml's error
            # Never skipped in silence: Ansible's group_vars/orin/main.yaml, or spark.YAML,
            # was a layer its author expected to apply and no box took.
            problems.append(Problem(Location(display, 1, 1), "", _not_a_layer(path, is_dir)))
            continue
        if stem not in known:
            near = nearest(stem, known)
            hint = f"; did you mean {near}.yaml?" if near else ""
            problems.append(
                Problem(Location(display, 1, 1), "", f"no box or group is named {stem!r}{hint}")
            )
            continue
        if stem in docs:
            problems.append(Problem(Location(display, 1, 1), "", "both .yaml and .yml exist"))
            continue
        try:
            docs[stem] = load_yaml(path, display, within=root)
        except DesiredStateError as exc:
            problems += exc.problems
        else:
            files.append((path, docs[stem]))
    return docs, problems


def _entries(root: Path, folder: Path, problems: list[Problem]) -> list[tuple[Path, bool]]:
    """Every entry of group_vars/ but one it may hold besides layers (a hidden one, an editor's
    backup, notes: fingerprint.ignored_entry), sorted, with whether it is a directory (or a
    symlink to one)."""
    try:
        with os.scandir(folder) as found:
            entries = [(Path(e.path), _is_dir(e)) for e in found if not ignored_entry(e.name)]
    except (FileNotFoundError, NotADirectoryError):
        # Said here, not as "no layers": every box then missed what all.yaml sets, a wall of
        # "required key is missing" blamed on other files that never named group_vars/.
        where = Location(_display(root, folder), 1, 1)
        problems.append(Problem(where, "", _not_a_folder(folder)))
        return []
    except OSError as exc:
        why = f"cannot be listed ({os.strerror(exc.errno or 0)})"
        problems.append(Problem(Location(_display(root, folder), 1, 1), "", why))
        return []
    return sorted(entries)


def _not_a_folder(folder: Path) -> str:
    want = "the repository's layers are group_vars/NAME.yaml files, all.yaml first"
    if os.path.exists(folder):  # a file, or a symlink to one
        return f"is not a directory: {want}"
    if os.path.islink(folder):
        return f"is a dangling symlink (to {os.readlink(folder)!r} that does not exist): {want}"
    return f"does not exist: {want}"


def _check_root(root: Path) -> None:
    """`--root /nonexistent` (or FLEET_ROOT) said `inventory/hosts.yaml: file not found`, as if
    the repository were there without its inventory."""
    if os.path.isdir(root):
        return
    why = "is not a directory" if os.path.lexists(root) else "does not exist"
    why = f"the fleet repository {why} (--root or {ROOT_ENV})"
    raise DesiredStateError([Problem(Location(printable(str(root)), 1, 1), "", why)])


def _is_dir(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir()
    except OSError:
        return False  # a symlink loop: load_yaml's located error, if its name is a layer's


def _not_a_layer(path: Path, is_dir: bool) -> str:
    if is_dir:
        return (
            "a directory: a layer is one file, group_vars/NAME.yaml (Ansible's "
            "group_vars/NAME/ directories are not read)"
        )
    stem, _, ext = path.name.rpartition(".")
    if ext.lower() in ("yaml", "yml"):
        fix = f"{stem}.{ext.lower()}"
        return f"not read: a layer's name ends in .yaml or .yml, lowercase; rename it {fix}"
    return "not a layer: group_vars/ holds only NAME.yaml (or NAME.yml) files"


def _overlay_file(root: Path, value: str, box: str | None = None) -> Path:
    """The file an overlay names (box_overlay's for `box`): the one place that decides it, so
    the file judged inside the repository is the file read."""
    path = Path(value if box is None else value.replace("{box}", box))
    return path if path.is_absolute() else root / path


def _overlay_problems(
    root: Path, inv_path: Path, inv: InventorySpec, inv_doc: SourceDoc
) -> list[Problem]:
    """An overlay is read from inside the repository, or beside the inventory naming it (an
    inventory given by path, as the lab's scenarios write theirs): the rule a symlinked file
    already follows. `box_overlay: /tmp/x.yaml` or `image_overlay: ../../x.yaml` read any file
    on the controller into every box's desired state, bypassing it. At most one problem a
    key: nothing of a refused overlay is read."""
    places = [os.path.realpath(root), os.path.realpath(inv_path.parent)]
    problems = []
    for key, value in (("image_overlay", inv.image_overlay), ("box_overlay", inv.box_overlay)):
        if value is None:
            continue
        at = inv_doc.positions.get((key,), inv_doc.positions[()])
        if key == "image_overlay" and "{box}" in value:
            # One file for every box: `{box}` there was checked once per box, then read as a
            # directory literally named {box} (a symlink to anywhere).
            why = "is one file for every box: `{box}` is for box_overlay (a box's own layer)"
            problems.append(Problem(at, key, f"{printable(value)} {why}"))
            continue
        boxes: Iterable[str | None] = inv.boxes if "{box}" in value else [None]
        if _outside(places, root, value, boxes):
            why = (
                f"{printable(value)} is outside the repository: an overlay is read from "
                "inside it (or beside the inventory that names it)"
            )
            problems.append(Problem(at, key, why))
        elif ".." in value.split("/"):
            # The kernel takes `..` from where a symlink leads (`lnk/../x.yaml` is beside
            # lnk's target), a path's text from where it is written: refused, not reasoned
            # about (an overlay is named from the repository's top, and needs no `..`).
            why = f"{printable(value)}: a `..` in an overlay's path is refused; name it from the "
            why += "repository's top (or by its absolute path beside the inventory)"
            problems.append(Problem(at, key, why))
    return problems


def _outside(places: list[str], root: Path, value: str, boxes: Iterable[str | None]) -> bool:
    """Whether the file `value` names (for any of `boxes`) resolves outside every place."""
    resolved: dict[str, str] = {}  # one directory's realpath, whichever box's file
    for box in boxes:
        path = str(_overlay_file(root, value, box))
        folder, base = os.path.split(path)
        if folder not in resolved:
            resolved[folder] = os.path.realpath(folder)
        real = os.path.join(resolved[folder], base)
        if base in ("", ".", ".."):
            real = os.path.realpath(path)
        if not any(os.path.commonpath([place, real]) == place for place in places):
            return True
    return False


def _box_overlays(
    root: Path,
    inv: InventorySpec,
    inv_doc: SourceDoc,
    files: list[tuple[Path, SourceDoc]],
    own: str | None = None,
) -> tuple[dict[str, SourceDoc], list[Problem]]:
    """Per-box last layers (the lab writes the digests of the deployment it rendered). `own`:
    the inventory's own box_overlay, where `inv`'s is a snapshot's facts (facts.with_facts)."""
    if inv.box_overlay is None:
        return {}, []
    at = inv_doc.positions.get(("box_overlay",), inv_doc.positions[()])
    docs, problems = {}, []
    for name in inv.boxes:
        path = _overlay_file(root, inv.box_overlay, name)
        if own is not None and own != inv.box_overlay and not os.path.lexists(path):
            # A box the snapshot does not hold (added to the inventory since it was saved):
            # judged against the inventory's own facts, as a snapshot without facts/ is.
            path = _overlay_file(root, own, name)
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
        else:
            files.append((path, docs[name]))
    return docs, problems


def _image_overlay(
    root: Path, inv: InventorySpec, inv_doc: SourceDoc, files: list[tuple[Path, SourceDoc]]
) -> tuple[SourceDoc | None, list[Problem]]:
    """The lab's registry digests replace the catalog's, as the last layer of every box."""
    if inv.image_overlay is None:
        return None, []
    path = _overlay_file(root, inv.image_overlay)
    at = inv_doc.positions.get(("image_overlay",), inv_doc.positions[()])
    if not os.path.lexists(path):  # anything else there is load_yaml's located error
        hint = " (run `reconcile lab up` first)" if ".lab" in str(path) else ""
        return None, [Problem(at, "image_overlay", f"{inv.image_overlay} does not exist{hint}")]
    doc = load_yaml(path, _display(root, path), within=root)
    files.append((path, doc))
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
