"""The rules table: every field compared, how, and what apply does when it differs.

One table (after community.docker's per-option comparison modes) so "what counts as drift"
is read in one place. Comparators in this package look their rule up by name; a field that is
not in the table is not compared.
"""

from __future__ import annotations

from typing import Literal

from reconciler.compare.drift import Action, Kind
from reconciler.records import record_class

Mode = Literal["strict", "allow_more_present", "ignore"]


@record_class()
class Rule:
    """How one kind of drift is found and what apply does about it."""

    name: str
    kind: Kind
    desired: str  # where the desired value comes from
    observed: str  # where the observed value comes from
    mode: Mode
    action: Action  # for a lane; the gateway's recreate is always RECREATE_GATEWAY


RULES: dict[str, Rule] = {
    rule.name: rule
    for rule in (
        Rule("envfile.key", Kind.ENVFILE, "managed keys", ".env (parsed like compose)", "strict",
             Action.REWRITE_ENV),
        Rule("envfile.mode", Kind.ENVFILE, "0600", "stat of .env", "strict", Action.REWRITE_ENV),
        Rule("compose.file", Kind.COMPOSE_FILE, "deployment.compose_files exist", "the box's files",
             "strict", Action.RESTORE_FILE),
        Rule("compose.dead-knob", Kind.COMPOSE_FILE, "managed .env knob -> its flag or image",
             "compose render from the desired .env", "strict", Action.RESTORE_FILE),
        # A desired service (a lane, the gateway) the render does not have: files edited, or a
        # profile left out; report-only when every file is as pinned (composefiles.py).
        Rule("compose.service", Kind.COMPOSE_FILE, "every desired service rendered",
             "compose render from the desired .env", "strict", Action.RESTORE_FILE),
        Rule("image.digest", Kind.IMAGE, "images: catalog digest",
             "RepoDigests of the running image", "strict", Action.PULL_RECREATE),
        Rule("image.pinned", Kind.IMAGE, "repo@sha256 reference", "Config.Image", "strict",
             Action.PULL_RECREATE),
        Rule("container.argv", Kind.ARGV, "compose render: entrypoint + command",
             "docker inspect: Config.Entrypoint + Config.Cmd", "strict", Action.RECREATE),
        # The same argv cut elsewhere between entrypoint and command: report-only (argv.py).
        Rule("container.argv-split", Kind.ARGV, "compose render: entrypoint",
             "docker inspect: Config.Entrypoint", "strict", Action.REPORT),
        # Image ENV lines are merged into the expected side first, so only real drift is left;
        # variables docker adds on its own (none today) would be allow_more_present.
        Rule("container.env", Kind.ENV, "image env + compose render: environment",
             "docker inspect: Config.Env", "strict", Action.RECREATE),
        Rule("container.ports", Kind.PORT, "gateway.bind:gateway.port; no lane port",
             "docker inspect: HostConfig.PortBindings", "strict", Action.RECREATE),
        # The OCI runtime the render names (`runtime: nvidia`); none named: the engine's default.
        Rule("container.runtime", Kind.STATE, "compose render: runtime",
             "docker inspect: HostConfig.Runtime", "strict", Action.RECREATE),
        # The restart policy the render names (`restart: unless-stopped`) against the one the
        # container holds: `docker update --restart` changes it without any recreate, and no
        # `compose up` puts it back (the config hash is unchanged). Report-only: the fix is
        # that same `docker update`, not a recreate that would reload the lane's model.
        Rule("container.restart", Kind.STATE, "compose render: restart",
             "docker inspect: HostConfig.RestartPolicy", "strict", Action.REPORT),
        # What the render mounts (`volumes:`, each bind's source interpolated: HF_CACHE, HOME)
        # against what the container mounts: a lane started from another environment (sudo,
        # cron: another HOME) reads its models from, and logs to, other directories.
        Rule("container.mounts", Kind.STATE, "compose render: volumes",
             "docker inspect: Mounts", "strict", Action.RECREATE),
        # compose's config hash of the files on the box against the container's label: what
        # the next `docker compose up` would recreate, for a setting no rule above compares.
        # Report-only: a person chooses when a model reloads (containers.py `_pending_recreate`).
        Rule("container.config-hash", Kind.STATE, "docker compose config --hash, the box's files",
             "docker inspect: label com.docker.compose.config-hash", "strict", Action.REPORT),
        Rule("state.missing", Kind.STATE, "a desired lane", "no container", "strict", Action.START),
        Rule("state.status", Kind.STATE, "running, healthy", "State.Status / Health", "strict",
             Action.RECREATE),
        Rule("state.stray", Kind.STATE, "no such lane", "a project container", "strict",
             Action.REMOVE),
        # A second container of a desired service (`docker compose run`, `--scale`): report-only,
        # because a converge removes by service (plan.py REMOVE -> converge.py `removes`) and
        # could take the service's own container instead of the copy.
        Rule("state.duplicate", Kind.STATE, "one container per service",
             "another container of the service", "strict", Action.REPORT),
        Rule("shell.export", Kind.SHELL_LEAK, "nothing from the shell",
             "the deploy user's login shell", "strict", Action.SCRUB_SHELL),
        Rule("contract.context", Kind.CONTRACT, "the lane's --max-model-len (docker inspect)",
             "gateway /capabilities", "strict", Action.RECREATE_GATEWAY),
        Rule("contract.desired-context", Kind.CONTRACT, "contract.<role>.context",
             "gateway /capabilities", "strict", Action.RECREATE_GATEWAY),
        Rule("contract.stale-lane", Kind.CONTRACT, "the lane's --max-model-len (docker inspect)",
             "gateway /capabilities (the lane off its desired window)", "strict", Action.REPORT),
        Rule("contract.untold-context", Kind.CONTRACT, "contract.<role>.context",
             "gateway /capabilities (a window the gateway is not told)", "strict",
             Action.REPORT),
        Rule("contract.lane-window", Kind.CONTRACT, "the lane's --max-model-len",
             "the lane's /v1/models max_model_len", "strict", Action.RECREATE),
        Rule("contract.ready", Kind.CONTRACT, "local roles ready, proxied roles proxied",
             "gateway /capabilities", "strict", Action.RECREATE_GATEWAY),
        Rule("contract.version", Kind.CONTRACT, "lobes.version", "gateway /health version",
             "strict", Action.RECREATE_GATEWAY),
        Rule("auth.posture", Kind.AUTH, "gateway.auth", "GET /v1/models without credentials",
             "strict", Action.RECREATE_GATEWAY),
        Rule("host.memory", Kind.HOST, "util x MemTotal + floor", "/proc/meminfo MemAvailable",
             "strict", Action.DROP_CACHES),
    )
}  # fmt: skip


def rule(name: str) -> Rule:
    return RULES[name]
