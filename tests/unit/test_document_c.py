"""A large replay reads its snapshot files straight into the typed document (document_c.py):
for every file it must give what the two steps document.py takes give (msgspec or json into
dicts, then the checked walk), or refuse it and leave it to them, so that every box's
document, probes and faults are the same whichever path read it.

Held here on every real capture in the repository, and on a few thousand damaged copies of
one: each field set to a value of another type, out of range, too long, not printable, a
secret that is not one, a key removed, renamed or added."""

from __future__ import annotations

import copy
import hashlib
import json
import pickle
import random
from pathlib import Path
from typing import Any

import pytest

from reconciler import records
from reconciler.observe.document_c import read_snapshot_file
from reconciler.observe.observe import BoxObservation, snapshot_observation
from tests.unit.test_observation_document import _paths

ROOT = Path(__file__).resolve().parents[2]
CAPTURES = sorted(
    p
    for pattern in ("examples/**/snapshot/*.json", "tests/fixtures/**/*.json")
    for p in ROOT.glob(pattern)
    if p.name != "index.json" and '"collected"' in p.read_text(encoding="utf-8")
)
THOR = ROOT / "examples" / "lab-incidents" / "snapshot" / "thor.json"


def _plain(value: Any) -> Any:
    """A document as nested plain values, types and order included (documents are eq=False)."""
    if records.is_record(value) and not isinstance(value, type):
        fields = records.fields(value)
        return (type(value).__name__, [(f.name, _plain(getattr(value, f.name))) for f in fields])
    if isinstance(value, dict):
        return ("dict", [(_plain(k), _plain(v)) for k, v in value.items()])
    if isinstance(value, tuple | list):
        return (type(value).__name__, [_plain(v) for v in value])
    if isinstance(value, frozenset):
        return ("frozenset", sorted(map(repr, value)))
    return (type(value).__name__, value)


def _observation(obs: BoxObservation) -> Any:
    return (
        _plain(obs.document),
        _plain(obs.probes),
        str(obs.failure),
        obs.error,
        obs.elapsed_s,
        obs.connection,
    )


def _both(path: Path) -> tuple[bool, Any, Any]:
    """(read by document_c, its observation, document.py's observation) of one file."""
    data = path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    typed = read_snapshot_file(data) is not None
    c_path = snapshot_observation("box", path, digest, in_c=True, raw_kept=False)
    two_steps = snapshot_observation("box", path, digest, in_c=True, raw_kept=True)
    return typed, _observation(c_path), _observation(two_steps)


def test_the_captures_are_found() -> None:
    assert len(CAPTURES) >= 20 and THOR in CAPTURES


@pytest.mark.parametrize("path", CAPTURES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_capture_reads_the_same(path: Path) -> None:
    typed, c_path, two_steps = _both(path)
    assert c_path == two_steps
    if path.parent.name == "snapshot":  # complete answers: the C path reads them itself
        assert typed


def test_the_same_render_twice_is_read_once(tmp_path: Path) -> None:
    raw = json.loads(THOR.read_text(encoding="utf-8"))
    raw["collected"]["render_login"] = copy.deepcopy(raw["collected"]["render"])
    path = tmp_path / "thor.json"
    path.write_text(json.dumps(raw, indent=1, sort_keys=True), encoding="utf-8")
    typed, c_path, two_steps = _both(path)
    assert typed and c_path == two_steps
    data = path.read_bytes()
    doc = read_snapshot_file(data)
    assert doc is not None and doc.document.render is doc.document.render_login
    original = read_snapshot_file(THOR.read_bytes())  # thor's login shell changes its render
    assert original is not None
    assert original.document.render is not original.document.render_login


# -- damaged copies -------------------------------------------------------------------------------
ODD_VALUES: list[Any] = [
    None, True, False, 0, -1, 7, 2**31 + 1, 2**53 + 1, 2**64, 1.5, "", "x", "\x01", "é",
    "a" * 70_000, [], [1], ["x", "\x7f"], {}, {"x": "y"}, {"x": 1}, "0o777", "0o8", "f" * 64,
    "F" * 64, "hmac:" + "0" * 64, {"secret": "hmac:" + "0" * 64},
    {"secret": "hmac:" + "0" * 63}, {"secret": "hmac:" + "0" * 64, "x": 1}, {"secret": 1},
    "\ud800", "0.0.0.0", "8000-8010", "70000",
]  # fmt: skip
ODD_KEYS = ["\x07bell", "zz_added", "a" * 70, "é", ""]
COPIES = 150  # per seed


def _damaged(raw: bytes, paths: list[tuple[Any, ...]], rng: random.Random) -> dict[str, Any]:
    doc = pickle.loads(raw)  # a deep copy, quicker than copy.deepcopy
    path = rng.choice(paths)
    parent = doc
    for step in path[:-1]:
        parent = parent[step]
    last = path[-1]
    what = rng.random()
    if what < 0.6:
        parent[last] = copy.deepcopy(rng.choice(ODD_VALUES))
    elif what < 0.75 and isinstance(parent, dict):
        del parent[last]
    elif what < 0.9 and isinstance(parent, dict):
        parent[rng.choice(ODD_KEYS)] = parent.pop(last)  # renamed (or moved)
    elif isinstance(parent[last], dict):
        parent[last][rng.choice(ODD_KEYS)] = copy.deepcopy(rng.choice(ODD_VALUES))
    elif isinstance(parent[last], list) and parent[last]:
        parent[last].append(copy.deepcopy(rng.choice(parent[last] + ODD_VALUES)))
    else:
        parent[last] = copy.deepcopy(rng.choice(ODD_VALUES))
    return doc


@pytest.mark.parametrize("seed", range(2))
def test_damaged_copies_read_the_same_or_go_to_document_py(seed: int, tmp_path: Path) -> None:
    original = json.loads(THOR.read_text(encoding="utf-8"))
    raw, paths = pickle.dumps(original), _paths(original)
    rng = random.Random(seed)
    path = tmp_path / "thor.json"
    typed_count = 0
    for _ in range(COPIES):
        damaged = _damaged(raw, paths, rng)
        # As save_snapshot writes a file (sorted keys: none repeated).
        text = json.dumps(damaged, indent=1, sort_keys=True, ensure_ascii=False)
        path.write_bytes(text.encode("utf-8", "surrogatepass"))
        typed, c_path, two_steps = _both(path)
        assert c_path == two_steps, damaged
        typed_count += typed
    # Both kinds occur: copies the C path reads itself, and copies it leaves to document.py.
    assert 0 < typed_count < COPIES


def _small(raw: dict[str, Any]) -> dict[str, Any]:
    """thor's file cut down to a few of everything the C path reads: quick to write and read,
    so that every field can be damaged every way."""
    doc = copy.deepcopy(raw)
    collected = doc["collected"]

    def few(env: dict[str, Any]) -> dict[str, Any]:
        secrets = [k for k, v in env.items() if isinstance(v, dict)][:1]
        return {k: env[k] for k in [*list(env)[:3], *secrets]}

    container = collected["docker"]["containers"][0]
    container["env"] = few(container["env"])
    collected["docker"]["containers"] = [container]
    images = collected["docker"]["images"]
    first = next(iter(images))
    collected["docker"]["images"] = {first: {**images[first], "env": few(images[first]["env"])}}
    for render in ("render", "render_login"):
        services = collected[render]["services"]
        name = next(iter(services))
        service = services[name]
        collected[render]["services"] = {
            name: {**service, "environment": few(service["environment"])}
        }
    secret_lines = [e for e in collected["envfile"] if isinstance(e["value"], dict)][:1]
    collected["envfile"] = collected["envfile"][:2] + secret_lines
    return doc


TYPED = ("collector", "user", "deploy_dir_exists", "docker", "render", "render_login", "envfile")


def test_every_field_the_c_path_reads_damaged_every_way(tmp_path: Path) -> None:
    small = _small(json.loads(THOR.read_text(encoding="utf-8")))
    raw = pickle.dumps(small)
    paths = [p for p in _paths(small["collected"]) if p and p[0] in TYPED]
    path = tmp_path / "thor.json"
    cases = typed_count = 0
    for n, where in enumerate(paths):
        # Each field removed; a value set to every odd value, an object or a list to a third.
        parent = small["collected"]
        for step in where[:-1]:
            parent = parent[step]
        leaf = not isinstance(parent[where[-1]], dict | list)
        for value in [KeyError, *(ODD_VALUES if leaf else ODD_VALUES[n % 3 :: 3])]:
            doc = pickle.loads(raw)
            parent = doc["collected"]
            for step in where[:-1]:
                parent = parent[step]
            if value is KeyError:
                if not isinstance(parent, dict):
                    continue
                del parent[where[-1]]
            else:
                parent[where[-1]] = copy.deepcopy(value)
            text = json.dumps(doc, indent=1, sort_keys=True, ensure_ascii=False)
            path.write_bytes(text.encode("utf-8", "surrogatepass"))
            typed, c_path, two_steps = _both(path)
            assert c_path == two_steps, (where, value)
            cases += 1
            typed_count += typed
    assert len(paths) > 100 and 0 < typed_count < cases
