"""One box's observation, read for adoption: `.env` lines against what the containers run.

The issue's rule: the `.env` and the running containers win over any earlier desired state,
and where the two disagree (a `.env` edited after the containers started, a lane recreated
alone), what runs wins and the disagreement is reported. A running container carries the
`.env` value it was created with (lobes' lanes read `.env` through `env_file`), so each key is
compared with the containers that carry it. Secrets are compared by their keyed digests only.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import get_args

from pydantic import TypeAdapter, ValidationError

from reconciler.compare.inline import hashed_inline, may_carry_secret
from reconciler.desired import secret_names
from reconciler.desired.roles import GATEWAY_SERVICE
from reconciler.importer.policy import SECRET_PATTERNS
from reconciler.importer.sourced import Finding, Sourced
from reconciler.observe.document import Container, EnvLine, EnvValue, Observed, SecretValue
from reconciler.scrub import mask_credentials


def secret_name(key: str) -> bool:
    """Whether `key` names a secret: the floor, the secret_patterns the adopted state carries
    (policy.py), and the fleet's own where a run adopted them (desired/secret_names.py)."""
    return secret_names.is_secret_name(key, (*SECRET_PATTERNS, *secret_names.fleet_patterns()))


def clear_secret(key: str, value: EnvValue | None) -> bool:
    """A value the box would have hashed (its key names a secret), held in clear: a snapshot
    saved before the box hashed that name, or edited since. A blank one is no secret (the
    collector's `masked` reads it as empty, lobes as no key)."""
    return isinstance(value, str) and bool(value.strip()) and secret_name(key)


def is_secret(key: str, value: EnvValue | None) -> bool:
    """A secret, hashed by the box or held in clear (`clear_secret`)."""
    return isinstance(value, SecretValue) or clear_secret(key, value)


def shown(value: EnvValue | None, key: str) -> str:
    """How a finding quotes `key`'s value: secrets never, not even as a digest. A value is
    judged by its key's name too: a clear one under a secret's name (`clear_secret`) is that
    secret itself, which the box's hashing never saw."""
    if value is None:
        return "(absent)"
    if is_secret(key, value):
        return "a secret (***)"
    assert isinstance(value, str)  # not a SecretValue (is_secret)
    if carries_secret(value):
        return "a value carrying a secret (***)"
    return repr(value) if len(value) <= 80 else repr(value[:77] + "...")


def carries_secret(value: str) -> bool:
    """A text with a secret inside (`--api-key x`, a URL's password `http://user:pw@proxy`):
    hashed in place by the box (`http://user:{"secret": "hmac:..."}@proxy`), or in clear in a
    snapshot saved before the box hashed such secrets. Judged as widely as the reports mask
    credentials (scrub.mask_credentials): a value taken for one is only left out, said."""
    return hashed_inline(value) or may_carry_secret(value) or mask_credentials(value) != value


def _taken(running: EnvValue, key: str) -> str:
    """What was done with the value a container runs. A secret is adopted only as a reference
    to a file holding it (secrets.py), which may not exist: its own note says which."""
    if isinstance(running, SecretValue):
        return "the key in use is looked for in the box's files (see secrets)"
    if clear_secret(key, running):
        # No digest to match with the box's files (secrets.py), and never written as a value.
        return "a secret held in clear by the snapshot is never adopted as a value"
    if carries_secret(running):
        # `text` refuses it: saying "adopted" here would contradict its own note.
        return "what runs is not adopted"
    return "adopted what runs"


@dataclass
class BoxView:
    name: str
    doc: Observed
    findings: list[Finding] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.env: dict[str, EnvLine] = self.doc.envfile_by_key()
        self.by_service: dict[str, Container] = {c.key: c for c in self.doc.containers}

    def writable(self, key: str, got: Sourced) -> bool:
        """Whether a converge could write `got` as `.env`'s `key` (the loader's rule,
        desired/types.check_env_value): a value the box holds that no quoting reads back (both
        ' and $, a control character) is left out, said here, so one such pin costs its key,
        never the whole import (the adopted state would not validate)."""
        from reconciler.compare.shell import redirecting_variable
        from reconciler.desired.types import check_env_value

        if redirecting_variable(key):
            # The loader refuses an `env:` pin of a variable that moves compose off the
            # deployment (desired/checks.py `_control_pins`): adopting it would refuse the
            # whole import.
            self.note(
                f"{key} is left out of the adopted state: compose or docker reads it itself "
                "(another project, other files, another engine or orphans removed for every "
                "`docker compose` there), so a desired state does not pin it; it stays as the "
                "box has it"
            )
            return False
        try:
            check_env_value(got.value)
        except ValueError as exc:
            self.note(f"{key} is left out of the adopted state: {exc}; it stays as the box has it")
            return False
        return True

    def env_key(self, key: str) -> bool:
        """Whether `key` may be an `env:` key of a desired state (the loader's EnvKey, whose
        pattern `.env` need not follow: compose reads `no_proxy`, `a-b`): one it refuses is left
        out, said here, so it costs its key, never the whole import."""
        valid, pattern = _env_key_rule()
        try:
            valid.validate_python(key)
        except ValidationError:
            self.note(
                f"{key} is left out of the adopted state: an env: key must match {pattern} "
                "(the loader's rule); it stays as the box has it"
            )
            return False
        return True

    def note(self, what: str) -> None:
        """`what` is shown through the report's scrubber, which masks the text after a
        secret-named `KEY:` or `KEY=` and any long run of letters and digits (a catalog name
        with a digest): notes name a key without a colon after it and quote image references
        (whose digests the scrubber keeps), never catalog names."""
        self.findings.append(Finding(self.name, what))

    @property
    def gateway(self) -> Container | None:
        return self.by_service.get(GATEWAY_SERVICE)

    def line(self, key: str) -> EnvLine | None:
        return self.env.get(key)

    def value(self, key: str, carriers: tuple[Container, ...] = ()) -> Sourced | None:
        """`key`'s value as `.env` sets it, or as the containers run it where they differ
        (reported). `carriers`: the containers that read the key (default: every container of
        the project that carries it)."""
        found = self.env.get(key)
        chosen = carriers or tuple(c for c in self.doc.containers if key in c.env)
        running = [(c, c.env[key]) for c in chosen if key in c.env]
        if found is not None:
            differs = [(c, v) for c, v in running if v != found.value]
            lacking = sorted(c.name for c in carriers if key not in c.env)
            if lacking and not differs:
                # Nothing else to adopt (a desired state cannot pin "absent"): said, not hidden.
                self.note(
                    f".env:{found.line} sets {key}, but {', '.join(lacking)} "
                    "run without it (created before the line was written)"
                )
            if not differs:
                return Sourced(found.value, f".env:{found.line}")
            c, v = differs[0]
            names = ", ".join(sorted(c.name for c, _ in differs))
            self.note(
                f".env:{found.line} sets {key} to {shown(found.value, key)}, but {names} "
                f"run{'s' if len(differs) == 1 else ''} with {shown(v, key)}; {_taken(v, key)}"
            )
            return Sourced(v, f"docker inspect ({c.name}; .env:{found.line} differs)")
        if running:
            c, v = running[0]
            if all(value == "" for _, value in running):
                # compose's `${KEY:-}`: an absent key runs empty; nothing to report.
                return Sourced("", f"docker inspect ({c.name}; not in .env)")
            if isinstance(v, str) and not carries_secret(v) and not clear_secret(key, v):
                taken = f"adopted {shown(v, key)} from {c.name}"
            else:  # a secret, or a value carrying one: never adopted as it runs
                taken = f"{c.name} runs {shown(v, key)}; {_taken(v, key)}"
            self.note(f"{key} is not in .env; {taken}")
            return Sourced(v, f"docker inspect ({c.name})")
        return None

    def text(
        self, key: str, carriers: tuple[Container, ...] = (), where: str | None = None
    ) -> Sourced | None:
        """A plain (non-secret) value. `where`: the desired state's path the value would be
        adopted at (`lanes.worker.env.WORKER_SPECULATIVE_CONFIG`), named when it is not."""
        got = self.value(key, carriers)
        if got is None:
            return None
        if not isinstance(got.value, str):
            if where is not None:
                # A lane's knob hidden whole by the box (a secret-named key): said, since the
                # lane then runs with something this desired state does not hold.
                self.note(f"{_owner(where)}{key} is a secret (***): not adopted{_unset(where)}")
            return None
        if clear_secret(key, got.value):
            # The same secret the box would have hashed, in clear (an older or edited
            # snapshot): a plain value written into group_vars would put it in the repository.
            self.note(
                f"{_owner(where)}{key} is a secret (***) held in clear by the snapshot: not "
                f"adopted{_unset(where)}"
            )
            return None
        if carries_secret(got.value):
            # The box hashed it in place: the text is no value a converge could write back
            # (it would put the digest on the box), and a clear one is a secret the adopted
            # repository must not hold. A desired state cannot point at part of a value.
            self.note(
                f"{_owner(where)}{key} carries a secret inside its value (***): not adopted; "
                f"it stays as the box has it{_unset(where)}"
            )
            return None
        return got


@functools.cache
def _env_key_rule() -> tuple[TypeAdapter[str], str]:
    """The loader's own type of an `env:` key, and its pattern to quote (never a copy)."""
    from reconciler.desired.models import EnvKey

    pattern = next(p for m in get_args(EnvKey)[1:] if (p := getattr(m, "pattern", None)))
    return TypeAdapter(EnvKey), str(pattern)


def _owner(where: str | None) -> str:
    """`lane worker: ` for a value a lane's path names, so the finding says whose it is."""
    parts = (where or "").split(".")
    return f"lane {parts[1]}: " if len(parts) > 2 and parts[0] == "lanes" else ""


def _unset(where: str | None) -> str:
    """What leaving the value out means: the adopted state does not hold it (a converge
    leaves the box's line alone, a drift does not compare it), so only the operator can."""
    if where is None:
        return ""
    return f" (the adopted state does not set {where}: the operator must set it)"
