"""Which of a box's compose renders a comparison reads: the one made from the `.env` that the
desired state would leave on the box.

The collector renders the desired `.env` (the box's own with the managed keys written, as a
converge writes it). A snapshot saved by `drift --save-snapshot` also holds the render of the
box's own `.env` where the two differ (`render_current`, `render_login_current`), so that the
snapshot replays against another desired state, such as one `reconcile import` adopted from
that very `.env`. Each render of such a run records its basis: the sha256 of the `.env`'s
assignments as the answer's `envfile` shows them (secrets as the run's keyed digests), which
the controller computes here from `envfile` and the managed keys alone. The desired `.env`'s
is the box's own with each managed key set as desired (`desired_pairs`; the collector's
`desired_basis`), not compose's reading of the text written: there a line the converge
leaves alone may read otherwise (`C=${A}` reads A's new value), which `envfile`, values and
not lines, cannot tell. Given the box's `.env`, those pairs tell the text a converge writes
as well (it writes exactly the keys whose value they change). The render whose
basis is the desired `.env`'s is read, else the box's own where the desired `.env` reads
alike (`reads_alike`); otherwise none: the snapshot holds no render of this `.env`, and what
reads one is not compared (`for_desired`). An answer without bases (every live drift, an older
snapshot) is read as before. Pure: no I/O.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
from collections.abc import Iterable, Mapping
from collections.abc import Set as AbstractSet

from reconciler.compare import inline
from reconciler.compare.envfile import EMPTY_IS_OFF, env_file_readers
from reconciler.desired.entries import EnvEntry, SecretName
from reconciler.observe.document import EnvValue, Observed, Render, SecretValue
from reconciler.records import replace


def env_basis(pairs: Mapping[str, EnvValue]) -> str:
    """The collector's `env_basis` of a `.env` whose assignments are `pairs` (in order): the
    same canonical JSON, byte for byte."""
    canonical = json.dumps(
        [[key, _shown(value)] for key, value in pairs.items()],
        separators=(",", ":"),
        sort_keys=True,
    )
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def _shown(value: EnvValue) -> str | dict[str, str]:
    return {"secret": value.digest} if isinstance(value, SecretValue) else value


def current_pairs(doc: Observed) -> dict[str, EnvValue] | None:
    """The box's `.env` as compose reads it: the last assignment of a key, at its first place.
    None: the deployment has no `.env`."""
    if doc.envfile is None:
        return None
    return {line.key: line.value for line in doc.envfile}


def desired_pairs(doc: Observed, env: Iterable[EnvEntry]) -> dict[str, EnvValue]:
    """The `.env` the collector renders for a desired state (its `desired_envfile`): each
    managed key written in place or appended, a null key's lines dropped (one whose value
    compose computes too: `envfile` shows it as written), and a secret whose source could not
    be read left as the box has it. Every other key as the box reads it now, even one whose
    line interpolates a key written (`C=${A}`): the pairs the render's basis is made of (the
    collector's `desired_basis`), not compose's reading of the desired text."""
    pairs = current_pairs(doc) or {}
    for entry in env:
        if entry.value is None:
            pairs.pop(entry.key, None)
        elif isinstance(entry.value, SecretName):
            source = doc.secret_sources.get(entry.value.secret)
            if source is not None and source.digest is not None:
                pairs[entry.key] = source.digest
        else:
            # As the box wrote it in its basis: a secret the value carries hashed inline.
            pairs[entry.key] = inline.desired_value(doc, entry.key, entry.value)
    return pairs


def renders_of(doc: Observed, basis: str | None) -> tuple[Render, Render | None] | None:
    """The (scrubbed, login-shell) renders made from the `.env` with this basis, if any."""
    if basis is None:
        return None
    if doc.render.basis == basis:
        return doc.render, doc.render_login
    own = doc.render_current
    if own is not None and own.basis == basis:
        return own, doc.render_login_current
    return None


# Said as the render's fault (a box error, compare/box.py), as a snapshot without a section is.
NO_RENDER = (
    "not in this snapshot: no compose render of this desired .env (saved against another "
    "desired state): the services' command lines, environments, runtimes and rendered images "
    "(dead knobs) not compared; a live drift renders it"
)


def _basis_less_render(key: str) -> str:
    return (
        f"not in this snapshot: its compose render (saved by an older version, without the "
        f"basis of its .env) disagrees with the desired .env on {key}: made from another "
        "desired state; the services' command lines, environments, runtimes and rendered "
        "images (dead knobs) not compared; save the snapshot again, or a live drift renders it"
    )


def stale_without_basis(doc: Observed, env: Iterable[EnvEntry]) -> Observed:
    """A replayed snapshot whose render records no basis (saved before renders had one) is
    read as made from the desired `.env`, which it was for the desired state it was saved
    against. Replayed against one edited since, its services' environments still carry the
    old values (a lane's `triton` where the desired `.env` now says `flashinfer`), compared
    and reported as the desired state's. Told by the services that read the `.env` whole
    through `env_file:` (`env_file_readers`): a managed key a converge would write (its desired
    value is not the box's line) that every such service holds with one other plain value was
    rendered from another `.env`. Then the renders are not read, as for a snapshot with bases
    (`for_desired`), with an error that says why. Only for a replay: a live answer's render is
    made from the desired `.env` by the collector itself.
    Told only by the keys the operator's desired state sets (group_vars, lanes, the gateway),
    not those the inventory derives (the box's name and address, the other members' seeds): a
    basis-less snapshot replayed after the mesh's membership changed keeps comparing its
    render, as before (the seeds its lanes hold are the old members'); so does the 1,000-box
    fleet bench/scale_fleet.py builds from three boxes' answers."""
    if doc.render.basis is not None or doc.render_current is not None:
        return doc  # bases recorded: for_desired chooses by them
    services = doc.render.services
    if not services or doc.envfile is None:
        return doc
    current = doc.envfile_by_key()
    written = [
        (e.key, e.value)
        for e in env
        if type(e.value) is str
        and not e.origin.startswith("inventory")  # see below
        and not (e.key in current and current[e.key].value == e.value)
        and not (doc.envfile_desired and e.key in doc.envfile_desired)  # masked inline secret
    ]
    if not written:
        return doc
    environments = [spec.environment for spec in services.values()]
    readers: list[Mapping[str, EnvValue]] | None = None
    for key, want in written:
        if all(env.get(key, want) == want for env in environments):
            continue  # no service holds another value: the common case, without the readers
        if readers is None:
            names = env_file_readers(services, current.keys())
            readers = [services[name].environment for name in names]
        held = {r.get(key) for r in readers}
        if len(held) == 1 and type(rendered := next(iter(held))) is str and rendered != want:
            missing = Render(None, error=_basis_less_render(key))
            login = None if doc.render_login is None else missing
            return replace(doc, render=missing, render_login=login)
    return doc


def for_desired(doc: Observed, env: Iterable[EnvEntry]) -> Observed:
    """`doc` with the renders of the desired state's `.env` in `render` and `render_login`.
    An answer without bases (every live drift: the collector records them only for a snapshot,
    whose render a live run always makes from the desired `.env`; a snapshot saved before
    renders had one) is returned as it is, at no cost. A snapshot none of whose renders has
    the desired `.env`'s basis (replayed against a desired state changed since, even where it
    holds one render) gets none, and the fault NO_RENDER: a render of another `.env` would
    report its values as drift (a stale dead knob) and miss what the desired one changes."""
    if doc.render.basis is None and doc.render_current is None:
        return doc
    desired = desired_pairs(doc, env)
    found = renders_of(doc, env_basis(desired))
    if found is None:
        found = alike_renders(doc, desired)
    if found is None:
        missing = Render(None, error=NO_RENDER)
        login = None if doc.render_login is None else missing
        return replace(doc, render=missing, render_login=login)
    if found[0] is doc.render:
        return doc
    return replace(doc, render=found[0], render_login=found[1])


def reads_alike(desired: Mapping[str, EnvValue], current: Mapping[str, EnvValue] | None) -> bool:
    """The two `.env` differ at most by keys set empty in one and absent from the other, which
    compose interpolates alike (`${KEY:-}`): an adopted open gateway pins `GATEWAY_API_KEY=`
    where lobes' `.env` has no line. Keys of lobes' `${KEY-default}` idiom (EMPTY_IS_OFF)
    differ. A service that reads the file through `env_file:` does not read them alike: see
    `alike_renders`."""
    if current is None:
        return False
    for key in desired.keys() | current.keys():
        want, have = desired.get(key), current.get(key)
        if want == have:
            continue
        if want not in ("", None) or have not in ("", None) or _empty_is_off(key):
            return False
    return True


def alike_renders(
    doc: Observed, desired: Mapping[str, EnvValue]
) -> tuple[Render, Render | None] | None:
    """The renders of the desired `.env`, made from those of the box's own where the two files
    read alike (`reads_alike`): the box's own renders, with each key set empty in one file and
    absent from the other put in (empty) or taken out of the environment of each service that
    reads the file whole through `env_file:` (compose gives it `KEY: ""` for `KEY=` and no KEY
    for no line; lobes' lanes). None: the files do not read alike, the snapshot holds no render
    of the box's own, or a key to take out may come from a service's own `environment:` (a
    variable the compose files interpolate), which a render does not tell apart."""
    current = current_pairs(doc)
    if current is None or not reads_alike(desired, current):
        return None
    found = renders_of(doc, env_basis(current))
    if found is None:
        return None
    empty = desired.keys() - current.keys()  # `KEY=` wanted where the box has no line
    gone = current.keys() - desired.keys()  # an empty line the desired `.env` drops
    services = found[0].services or {}
    readers = [
        name
        for name in (env_file_readers(services, current.keys()) if empty or gone else ())
        if any(k not in services[name].environment for k in empty)
        or any(services[name].environment.get(k) == "" for k in gone)
    ]  # each one whose environment the difference changes
    if not readers:
        return found
    if gone & doc.variables.names:
        return None
    basis = env_basis(desired)
    own, login = found
    return _with_empties(own, readers, empty, gone, basis), (
        None if login is None else _with_empties(login, readers, empty, gone, basis)
    )


def _with_empties(
    render: Render, readers: list[str], empty: AbstractSet[str], gone: AbstractSet[str], basis: str
) -> Render:
    """`render` as the `.env` with `empty` set empty and `gone` dropped renders it, for the
    services that read that file whole (`readers`)."""
    if render.services is None:  # a render that failed (the login shell's) stays failed
        return replace(render, basis=basis)
    services = dict(render.services)
    for name in readers:
        spec = services.get(name)
        if spec is None:
            continue
        # Only the file's empty value goes: another one is what the service reads after it.
        env = {k: v for k, v in spec.environment.items() if k not in gone or v != ""}
        for key in empty:
            env.setdefault(key, "")  # a service's own `environment:` KEY wins over env_file's
        services[name] = replace(spec, environment=env)
    return replace(render, services=services, basis=basis)


def _empty_is_off(key: str) -> bool:
    return any(fnmatch.fnmatchcase(key, pattern) for pattern in EMPTY_IS_OFF)


def current_render(doc: Observed) -> Render:
    """compose's render of the `.env` on the box (what an import adopts), else `render`."""
    pairs = current_pairs(doc)
    found = renders_of(doc, None if pairs is None else env_basis(pairs))
    return found[0] if found is not None else doc.render
