"""What a drift run derives from the desired state, as plain values, remembered between runs.

Per box a drift run needs four things from the desired state: the flattened expectation that
compare/ works against, the collector's payload, the SSH target and the gateway URL the
controller probes. All four are a pure function of the desired-state files and of this
package's code, and none holds a validation model, so a valid state's inputs are pickled in
the controller user's cache directory (0700, files 0600) with the fingerprint of both. A run
whose files and code are byte-identical loads them before importing pydantic or the YAML
parser, starts the boxes' collectors at once (observe/early.py), and never loads the desired
state at all; any change misses, and the state is loaded and validated as before.

Each box's part of the entry carries its CRC-32, checked where the part is read: a replay's
workers check only the parts they unpickle, from the pages they read anyway (~4 ms in all at
1,000 boxes; checking the whole entry as it is opened cost 20-70 ms here when each box's mesh
seeds were stored as text, ~60 MB, mostly faulting in pages a run may never read). A part that
fails it, or fails to unpickle (the file damaged after it was written), is derived again from the
desired-state files, as a miss would be, and the entry is dropped for the next run to store
anew: the run gives the right answer, never a traceback.

The entry holds no secret: payloads and expectations name secret sources, never values. A
controller_env secret is a name and a variable here; its value is read from the environment
of each run when the collectors start (observe/controller_secrets.py), never remembered.
"""

from __future__ import annotations

import io
import pickle
import zlib
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, NamedTuple, SupportsIndex

from reconciler.desired.cache import LIBRARIES
from reconciler.desired.fingerprint import (
    Buffer,
    code_version,
    forget,
    library_stamps,
    remember,
    remembered,
)
from reconciler.desired.mesh_seeds import seeds_text
from reconciler.desired.secret_names import effective
from reconciler.gc_pause import paused_gc
from reconciler.observe.transport import Target

if TYPE_CHECKING:
    from reconciler.compare.context import BoxExpectation
    from reconciler.desired.entries import EnvEntry
    from reconciler.desired.fleet import Fleet

# 2: secret_patterns; 3: each box's part checked, the libraries' versions; 4: seeds by reference
CACHE_VERSION = 4
PACKAGE = Path(__file__).parent


class DriftInputs(NamedTuple):
    """Everything a drift run needs from the desired state, flattened and cacheable. (A
    NamedTuple: no dataclass before the spawn, observe/transport.py says why.)"""

    inventory_file: str  # as reports name it (inventory/lab.yaml)
    boxes: tuple[str, ...]  # every box of the inventory, in its order
    expectations: Mapping[str, BoxExpectation]
    payloads: Mapping[str, dict[str, Any]]  # collector payload per box, without the run key
    targets: dict[str, Target]
    bases: dict[str, str]  # gateway base URL per box, as the controller reaches it
    # Desired-state files from outside the repository (desired/facts.py), for --save-snapshot.
    facts: Mapping[str, str] = MappingProxyType({})
    # Every box's secret_patterns beyond the floor: the run adopts them for its last guards
    # (secret_names.adopt_fleet_patterns), which judge a name with no box at hand.
    secret_patterns: tuple[str, ...] = ()
    # The mesh members' gateway origins, sorted, and each member's own place among them
    # (desired/envfile.py MeshSeeds): a box's LOBES_MESH_SEEDS is stored as a reference to
    # these, not as its text (_PerBox).
    mesh_origins: tuple[str, ...] = ()
    mesh_position: Mapping[str, int] = MappingProxyType({})

    def payload(self, box: str, run_key: str) -> dict[str, Any]:
        # A remembered payload is re-floored on use: an entry written by older code (or edited
        # in the cache) can never send the collector fewer secret names than the floor.
        patterns = effective(self.payloads[box].get("secret_patterns") or ())
        return {**self.payloads[box], "secret_patterns": list(patterns), "run_key": run_key}

    def __reduce_ex__(self, protocol: SupportsIndex) -> tuple[Any, ...]:
        # The expectations and payloads are stored a box at a time and read back the same way
        # (_PerBox): a replay's worker unpickles only the boxes it compares, a live run only
        # the payloads it sends, and neither imports the comparison's types before the boxes
        # work (compare/context.py, desired/entries.py: ~8 ms). Their bytes go out of band
        # (protocol 5): the remembered entry's file is mapped, not read (desired/fingerprint.py).
        # Each box's seeds name every other member, so stored as text they made the entry grow
        # as the square of the fleet (58 MB of its 62 at 1,000 boxes, held again by the child
        # that stores it: the replay's peak memory); they are stored as the box's place in the
        # mesh's origins, kept once.
        seeds = _Seeds(self.mesh_origins, self.mesh_position, self.payloads)
        expectations = _PerBox.stored(self.expectations, protocol, seeds)
        payloads = _PerBox.stored(self.payloads, protocol, seeds)
        fields = (self.inventory_file, self.boxes, expectations, payloads, self.targets)
        mesh = (self.mesh_origins, dict(self.mesh_position))
        return (_remembered, (*fields, self.bases, self.facts, self.secret_patterns, *mesh))


def _remembered(
    inventory_file: str,
    boxes: tuple[str, ...],
    expectations: tuple[Any, dict[str, tuple[int, int, int]]],
    payloads: tuple[Any, dict[str, tuple[int, int, int]]],
    targets: dict[str, Target],
    bases: dict[str, str],
    facts: Mapping[str, str],
    secret_patterns: tuple[str, ...],
    mesh_origins: tuple[str, ...] = (),
    mesh_position: dict[str, int] | None = None,
) -> DriftInputs:
    position = mesh_position or {}
    seeds = _Seeds(mesh_origins, position)
    stored = (_PerBox(*expectations, seeds), _PerBox(*payloads, seeds))
    mesh = (mesh_origins, MappingProxyType(position))
    return DriftInputs(
        inventory_file, boxes, *stored, targets, bases, facts, secret_patterns, *mesh
    )


SEEDS_REF = "mesh-seeds"
SEEDS_WORTH_A_REFERENCE = 256  # bytes of text; below it the text pickles as itself


class _Seeds:
    """A box's LOBES_MESH_SEEDS text from the mesh's sorted origins, built as the desired
    state builds it (desired/mesh_seeds.py, for both); and, while storing, the very object a
    box's values hold for it (`held`)."""

    def __init__(
        self,
        origins: tuple[str, ...],
        position: Mapping[str, int],
        payloads: Mapping[str, dict[str, Any]] | None = None,
    ) -> None:
        self.origins, self.position, self._payloads = origins, position, payloads

    def text(self, box: str) -> str:
        return seeds_text(self.origins, self.position, box)

    def held(self, box: str) -> str | None:
        """The seeds object the box's derived values share (drift_inputs() makes the payload's
        managed_env from the same `.env` entries as the expectation), if it is the text a
        remembered entry builds again and long enough to be worth a reference; else None."""
        if not self.origins or self._payloads is None:
            return None
        held = (self._payloads[box].get("managed_env") or {}).get("LOBES_MESH_SEEDS")
        if not isinstance(held, str) or len(held) < SEEDS_WORTH_A_REFERENCE:
            return None
        return held if held == self.text(box) else None


# A box's pickle that refers to its seeds begins by putting them in the unpickler's memo, at
# slot 0: the reference (persistent_load builds the text again), MEMOIZE, POP. Its pickler is
# handed slot 0 for the box's seeds object, so each occurrence of that object is a memo GET.
# Not a `persistent_id` method: pickle calls one for every object it writes, and at 1,000
# boxes those 900,000 Python calls made pickling the drift inputs take 0.22-0.33 s of CPU
# here, against 0.14-0.17 s so (as the storing child runs: no collector passes).
# An equal text that is another object (none today) is stored as itself: a larger entry,
# never another value.
_SEEDS_IN_SLOT_0 = b"".join(
    (
        pickle.PROTO,
        bytes([4]),  # the first protocol with MEMOIZE; the box's pickle names its own after
        pickle.SHORT_BINUNICODE,
        bytes([len(SEEDS_REF)]),
        SEEDS_REF.encode(),
        pickle.BINPERSID,
        pickle.MEMOIZE,
        pickle.POP,
    )
)


def _box_pickle(value: Any, seeds: str | None) -> memoryview:
    out = io.BytesIO()
    if seeds is None:
        pickle.dump(value, out, pickle.HIGHEST_PROTOCOL)
    else:
        out.write(_SEEDS_IN_SLOT_0)
        pickler = pickle.Pickler(out, pickle.HIGHEST_PROTOCOL)
        pickler.memo = {id(seeds): (0, seeds)}
        pickler.dump(value)
    return out.getbuffer()


class _BoxUnpickler(pickle.Unpickler):
    def __init__(self, file: io.BytesIO, seeds: Callable[[], str]) -> None:
        super().__init__(file)
        self._seeds = seeds

    def persistent_load(self, pid: Any) -> Any:
        if pid != SEEDS_REF:
            raise pickle.UnpicklingError(f"unknown reference {pid!r}")
        return self._seeds()


class _PerBox(Mapping[str, Any]):
    """A mapping stored as one pickle per box, end to end in one buffer (bytes, or a view of
    the mapped cache file), each box's value unpickled the first time it is asked for, once
    its bytes match their recorded CRC-32. One that does not (or does not unpickle) is asked
    of `again`, when its owner gave one (cached_inputs: derived again from the files). A box's
    mesh seeds are stored as a reference and built again from `seeds` when it is unpickled."""

    def __init__(
        self, data: Buffer, where: dict[str, tuple[int, int, int]], seeds: _Seeds | None = None
    ) -> None:
        self._data = memoryview(data)
        self._where = where  # box -> (offset, length, CRC-32) in data
        self._seeds = seeds if seeds is not None else _Seeds((), {})
        self._value: dict[str, Any] = {}
        self.again: Callable[[str], Any] | None = None

    @staticmethod
    def stored(
        values: Mapping[str, Any], protocol: SupportsIndex, seeds: _Seeds
    ) -> tuple[Any, dict[str, Any]]:
        data, where = bytearray(), {}
        for box, value in values.items():
            one = _box_pickle(value, seeds.held(box))
            where[box] = (len(data), len(one), zlib.crc32(one))
            data += one
        # Out of band where the protocol allows it (the caller may keep the buffer apart).
        return (pickle.PickleBuffer(data) if int(protocol) >= 5 else bytes(data)), where

    def __getitem__(self, box: str) -> Any:
        if box not in self._value:
            start, length, check = self._where[box]
            part = self._data[start : start + length]
            try:
                # ~4 µs for a box's ~30 KB (Adler-32 measured slower here, SHA-256 ~5x)
                if zlib.crc32(part) != check:
                    raise ValueError(f"the remembered part of box {box!r} is damaged")
                with paused_gc():  # acyclic, like the rest of the entry (fingerprint.remembered)
                    value = _BoxUnpickler(io.BytesIO(part), lambda: self._seeds.text(box)).load()
            except Exception:
                if self.again is None:
                    raise
                value = self.again(box)
            self._value[box] = value
        return self._value[box]

    def forget(self, box: str) -> None:
        """Drop `box`'s unpickled value (asked for again, it is unpickled again): a replay
        compares each box once, and a worker that kept every box it compared held each one's
        mesh seeds, which name every member: memory growing as the square of the fleet."""
        self._value.pop(box, None)

    def __iter__(self) -> Iterator[str]:
        return iter(self._where)

    def __len__(self) -> int:
        return len(self._where)


def expectations(
    fleet: Fleet, boxes: list[str], envs: dict[str, list[EnvEntry]] | None = None
) -> dict[str, BoxExpectation]:
    """`envs`: the boxes' managed `.env`, if the caller derived it already (fleet_env)."""
    from reconciler.compare.context import expectation
    from reconciler.desired.envfile import fleet_env

    hosts: dict[str, str] = {
        str(role): name
        for name, spec in fleet.boxes.items()
        for role, contract in spec.contract.items()
        if contract.context is not None
    }
    envs = envs if envs is not None else fleet_env(fleet, boxes)
    return {
        name: expectation(fleet.boxes[name], envs[name], hosts, fleet.connection(name).ssh_user)
        for name in boxes
    }


def targets(fleet: Fleet, boxes: list[str]) -> dict[str, Target]:
    out = {}
    for name in boxes:
        conn = fleet.connection(name)
        out[name] = Target(
            box=name,
            hostname=conn.ssh_hostname,
            user=conn.ssh_user,
            port=conn.ssh_port,
            key_file=fleet.resolve_path(conn.ssh_key) if conn.ssh_key else None,
            known_hosts=(
                fleet.resolve_path(conn.ssh_known_hosts_file) if conn.ssh_known_hosts_file else None
            ),
        )
    return out


def gateway_bases(fleet: Fleet, boxes: list[str]) -> dict[str, str]:
    from reconciler.desired.types import url_host  # an IPv6 host goes in brackets

    return {
        name: f"http://{url_host(fleet.connection(name).ssh_hostname)}:"
        f"{fleet.boxes[name].gateway.port}"
        for name in boxes
    }


def drift_inputs(fleet: Fleet) -> DriftInputs:
    """Everything a drift run of any of the fleet's boxes needs (pure)."""
    from reconciler.desired.envfile import fleet_env, mesh_seeds
    from reconciler.desired.facts import facts_of
    from reconciler.gc_pause import young_only
    from reconciler.observe.payload import collector_payload

    boxes = list(fleet.boxes)
    mesh = mesh_seeds(fleet)
    # Hundreds of thousands of new objects at 1,000 boxes, all kept: the collector's older
    # passes would walk them again and again for no garbage (reconciler/gc_pause.py).
    with young_only():
        envs = fleet_env(fleet, boxes)  # once per box, for both its expectation and payload
        payloads = {}
        for name in boxes:
            payload = collector_payload(fleet.boxes[name], envs[name], run_key="")
            payloads[name] = {k: v for k, v in payload.items() if k != "run_key"}
        return DriftInputs(
            inventory_file=fleet.inventory_file,
            boxes=tuple(boxes),
            expectations=expectations(fleet, boxes, envs),
            payloads=payloads,
            targets=targets(fleet, boxes),
            bases=gateway_bases(fleet, boxes),
            facts=facts_of(fleet),
            secret_patterns=tuple(
                dict.fromkeys(p for spec in fleet.boxes.values() for p in spec.secret_patterns)
            ),
            mesh_origins=mesh.origins,
            mesh_position=MappingProxyType(mesh.position),
        )


# -- the cache ---------------------------------------------------------------------------------
KIND = "drift-inputs"


def _code() -> str:
    # The libraries too: the entry stands for a state they parsed and validated
    return code_version(PACKAGE, f"{CACHE_VERSION}/{library_stamps(*LIBRARIES)}")


def cached_inputs(root: Path, inventory: Path) -> DriftInputs | None:
    """The remembered inputs if no desired-state file and no code changed, else None. A box's
    part found damaged where it is read is derived again (`_Again`)."""
    inputs = remembered(KIND, root, inventory, _code())
    if not isinstance(inputs, DriftInputs):
        return None
    again = _Again(root, inventory)
    for per_box, field in ((inputs.expectations, "expectations"), (inputs.payloads, "payloads")):
        if isinstance(per_box, _PerBox):
            per_box.again = again.one(field)
    return inputs


class _Again:
    """The drift inputs derived again from the desired-state files, once per process, for a
    remembered entry found damaged where a box's part was read (in a replay's worker, or as a
    live run sends the payloads). The entry is dropped first: the next run stores it anew."""

    def __init__(self, root: Path, inventory: Path) -> None:
        self.root, self.inventory = root, inventory
        self._inputs: DriftInputs | None = None

    def one(self, field: str) -> Callable[[str], Any]:
        return lambda box: getattr(self.inputs(), field)[box]

    def inputs(self) -> DriftInputs:
        if self._inputs is None:
            from reconciler.desired.cache import load_fleet_cached
            from reconciler.gc_pause import collecting

            forget(KIND, self.root, self.inventory)
            with collecting():  # the loader's garbage is not all acyclic (cli._load)
                fleet = load_fleet_cached(self.root, str(self.inventory))
                self._inputs = drift_inputs(fleet)
        return self._inputs


def remembered_inputs(fleet: Fleet, inventory: Path) -> DriftInputs:
    """The inputs of a freshly validated state, stored for the next run."""
    inputs = drift_inputs(fleet)
    # As the loader read them (also when `fleet` was remembered: its hit proved they still
    # hold these bytes), not read again
    remember(KIND, fleet.root, inventory, _code(), fleet.inputs, inputs, fleet.seen)
    return inputs
