"""Drift as a value: what differs on a box, where it came from, and what apply would do.

Pure data, no I/O. A secret never appears here in clear: the collector replaced it on the box
with a keyed digest, and a drift carries `SecretValue(digest)`, which reports render as `***`.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

# A secret as the box's keyed digest: the observation document's type, carried as is.
from reconciler.observe.document import SecretValue
from reconciler.records import field, record_class

__all__ = [
    "Action",
    "BoxError",
    "BoxResult",
    "Drift",
    "DriftReport",
    "Kind",
    "Part",
    "SecretValue",
    "Value",
]


class Kind(StrEnum):
    ENVFILE = "envfile"  # the deployed .env differs from the desired one, per key
    IMAGE = "image"  # a lane runs another digest, or an unpinned tag
    ARGV = "argv"  # a container's command differs from what compose renders
    ENV = "env"  # a container's environment differs from what compose renders
    PORT = "port"  # a published port or bind address differs
    COMPOSE_FILE = "compose-file"  # a compose file was edited by hand
    STATE = "state"  # a lane missing/exited/restarting/unhealthy, or a stray container
    SHELL_LEAK = "shell-leak"  # the login shell exports a variable compose interpolates
    CONTRACT = "contract"  # /capabilities or /health disagrees with the lanes / desired
    AUTH = "auth"  # the gateway's live posture differs from the desired one
    HOST = "host"  # MemAvailable below what the next lane boot needs


class Action(StrEnum):
    """What a converge would do about a drift (the apply plan is derived from these)."""

    REWRITE_ENV = "rewrite-env"  # write the managed .env keys
    RESTORE_FILE = "restore-file"  # put a compose file back
    PULL_RECREATE = "pull-and-recreate"  # pull the digest, recreate the lane
    RECREATE = "recreate"  # recreate the lane from the desired config
    RECREATE_GATEWAY = "recreate-gateway"  # recreate the gateway (scrubbed environment)
    START = "start"  # start a missing or exited lane
    REMOVE = "remove"  # remove a container the desired state does not know
    DROP_CACHES = "drop-caches"  # drop the page cache before the next lane boot
    SCRUB_SHELL = "report-only:shell"  # converges already run compose scrubbed; the export stays
    REPORT = "report-only"  # nothing to do automatically; a person decides


Value = str | int | float | bool | None | SecretValue | tuple[Any, ...]


@record_class()
class Drift:
    """One difference. Sorted by (box, kind, subject, path) so every report is stable."""

    box: str
    kind: Kind
    subject: str  # "lane:vllm-worker", "gateway", "file:.env", "shell", "host"
    # "WORKER_MAX_MODEL_LEN", "--max-model-len", "8000/tcp", "capabilities.worker.context"
    path: str
    desired: Value
    observed: Value
    action: Action
    source: str | None = None  # where the observed value came from: "~/.bashrc:6", ".env:41"
    note: str | None = None  # one line for a person: why this matters

    @property
    def is_secret(self) -> bool:
        return isinstance(self.desired, SecretValue) or isinstance(self.observed, SecretValue)

    @property
    def secret_changed(self) -> bool | None:
        """For a secret: did the value change (digests differ)? None if not a secret, or if
        the two digests cannot be compared (`comparable`)."""
        if not self.is_secret or not comparable(self.desired, self.observed):
            return None
        return self.desired != self.observed

    def sort_key(self) -> tuple[str, str, str, str]:
        return (self.box, self.kind.value, self.subject, self.path)


# Digests of a clear value made by this process, each kind with a key of its own, never the
# box's (keyed by the run's key, which the controller does not hold):
# - what compare/inline.py makes of a clear value that may carry a secret inline (a desired one
#   the answer has no mask of, an older collector's line);
LOCAL_DIGEST = "clear:"
# - what the reports' guard (report/values.py `guarded`) makes of a clear value under a secret
#   name or flag (a snapshot saved by an older collector, or edited).
GUARD_DIGEST = "guard:"
_DIGEST_KINDS = (LOCAL_DIGEST, GUARD_DIGEST)


def digest_kind(digest: str) -> str:
    """Who keyed a digest: LOCAL_DIGEST, GUARD_DIGEST, or "" for the box (the run's key)."""
    for kind in _DIGEST_KINDS:
        if digest.startswith(kind):
            return kind
    return ""


def comparable(desired: object, observed: object) -> bool:
    """Whether two values' digests say whether a secret changed: only when the same key made
    both (`digest_kind`). This process's digest of a clear value against a secret otherwise
    hashed (the box's, or this process's under its other key) differs whatever the secrets
    are, so neither "changed" nor "unchanged" is known. A secret against a value that is none
    (absent, plain) is comparable: it changed."""
    if not (isinstance(desired, SecretValue) and isinstance(observed, SecretValue)):
        return True
    return digest_kind(desired.digest) == digest_kind(observed.digest)


class Part(StrEnum):
    """The part of a box a fault is about: what a plan decides by, never a message's text."""

    OBSERVATION = "observation"  # the box's answer could not be used at all
    DEPLOYMENT = "deployment"  # the deployment directory is missing, or a converge was running
    DOCKER = "docker"  # the engine could not be asked
    RENDER = "render"  # `docker compose config` failed
    VARIABLES = "variables"  # `docker compose config --variables` failed
    LOGIN_SHELL = "login_shell"  # the login shell could not be traced
    GATEWAY_PROBE = "gateway-probe"  # a loopback probe of the gateway got no answer
    CONNECTION = "connection"  # reached only through an existing SSH connection
    SECRET_SOURCE = "secret-source"  # a box_file secret's file or key is missing
    BOX_FILE = "box-file"  # a file on the box is there but could not be read (a FIFO, ...)
    CONFIG_HASH = "config-hash"  # compose gave no config hashes: no pending recreate judged


class BoxError(str):
    """One fault of a box: the line reports print (it is that text), with the `part` of the box
    it is about and `where` (the probe, section or secret), which plans and checks read."""

    part: Part
    where: str
    what: str

    def __new__(cls, part: Part, where: str, what: str = "") -> BoxError:
        self = super().__new__(cls, f"{where}: {what}" if what else where)
        self.part, self.where, self.what = part, where, what
        return self

    def __getnewargs__(self) -> tuple[Part, str, str]:  # type: ignore[override]
        # copy, deepcopy and pickle rebuild it from its parts, not from the text
        return (self.part, self.where, self.what)


@record_class()
class BoxResult:
    """Everything known about one box after a run: drift, or why it could not be observed."""

    box: str
    reachable: bool
    drifts: tuple[Drift, ...] = ()
    errors: tuple[BoxError, ...] = ()  # per-box faults: unreachable, dockerd down, gateway timeout
    facts: dict[str, Any] = field(default_factory=dict)  # small observed facts for the report
    # Not observed, but its gateway answered the controller: what was seen (compare/partial.py)
    partial: str | None = None

    @property
    def observation(self) -> str:
        """How much of the box was seen: `full` (its own answer), `partial` (only the
        controller's probes of its gateway: SSH failed) or `none`."""
        if self.partial is not None:
            return "partial"
        return "full" if self.reachable else "none"


@record_class()
class DriftReport:
    """The drift of every box of one run, in inventory order."""

    boxes: tuple[BoxResult, ...]
    inventory: str
    generated_at: str  # ISO 8601 UTC
    run_id: str

    @property
    def drifts(self) -> tuple[Drift, ...]:
        return tuple(d for b in self.boxes for d in b.drifts)

    @property
    def exit_code(self) -> int:
        return worst_exit(
            any(not b.reachable or b.errors for b in self.boxes), any(b.drifts for b in self.boxes)
        )


def worst_exit(not_all_observed: bool, drifted: bool) -> int:
    """A drift run's exit code: 0 no drift, 2 drift, 1 a box that could not be observed or had
    errors (worst wins)."""
    if not_all_observed:
        return 1
    return 2 if drifted else 0


def sorted_drifts(drifts: list[Drift]) -> tuple[Drift, ...]:
    return tuple(sorted(drifts, key=Drift.sort_key))
