"""Types of the desired-state values that reach a command line, a path or a box's `.env`.

A value typed here is refused at load time, with the FILE:LINE:COL that set it, unless it is
what its name says. Each type documents what it lets through and why the rest is dangerous:
the fleet holds SSH access to every box and writes `.env` files full of keys, so a YAML value
must never become an ssh option (`ssh_user: -oProxyCommand=...` ran a command on the
controller), a line of its own in `.env`, a path outside the deploy user's home, or a second
mesh seed.

The checks are plain functions (`check_*`), each raising ValueError with the operator-facing
message, so the loader's explain machinery reports them like any other problem; the pydantic
types wrap them and state the same rule in the JSON Schema for editors. Messages never echo a
value that may hold a secret (an `.env` value, a URL that could carry credentials).
"""

from __future__ import annotations

import ipaddress
import re
import socket
from typing import Annotated, Any

from pydantic import AfterValidator, WithJsonSchema

from reconciler.desired.refs import is_image_ref

# C0 controls and DEL: invisible in a report, a terminal escape (ESC) when printed, and NUL, CR
# and LF end a line or a C string. NEL (U+0085) and the line and paragraph separators (U+2028,
# U+2029) too: compose splits `.env` at LF only, but Python's str.splitlines() (which box
# programs once used) also splits at them and at VT, FF and FS/GS/RS, so a value holding one was
# two lines to one reader and one to the other. TAB alone is ordinary text in an `.env` value.
_BREAKS = r"\x85\u2028\u2029"
_CONTROL = re.compile(rf"[\x00-\x08\x0a-\x1f\x7f{_BREAKS}]")
_CONTROL_OR_TAB = re.compile(rf"[\x00-\x1f\x7f{_BREAKS}]")
_CHAR_NAMES = {
    "\x00": "a NUL byte",
    "\n": "a line feed",
    "\r": "a carriage return",
    "\x85": "a next-line character (U+0085)",
    "\u2028": "a line separator (U+2028)",
    "\u2029": "a paragraph separator (U+2029)",
}


def _control_problem(value: str, *, tab_ok: bool = True) -> str | None:
    found = (_CONTROL if tab_ok else _CONTROL_OR_TAB).search(value)
    if found is None:
        return None
    char = found.group()
    return _CHAR_NAMES.get(char, f"the control character U+{ord(char):04X}")


def _schema(extra: dict[str, str]) -> WithJsonSchema:
    """What editors are told about a checked string (the check itself says more)."""
    return WithJsonSchema({"type": "string", **extra})


# --- SSH: the user and host of a box ---------------------------------------------------------

# What Debian's useradd accepts by default (and POSIX's portable user names narrowed to lower
# case): a lowercase letter or `_`, then up to 31 of [a-z0-9_-]. Never a leading `-`, so it can
# never be an ssh option. useradd also allows a trailing `$`, but only Samba machine accounts
# use it, they cannot log in, and `$` is a shell metacharacter wherever the name is pasted.
USER_NAME = re.compile(r"[a-z_][a-z0-9_-]{0,31}")


def check_user_name(value: str) -> str:
    if not USER_NAME.fullmatch(value):
        raise ValueError(
            f"{value!r} is not a POSIX user name (a lowercase letter or _, then up to 31 of "
            "a-z, 0-9, _ and -)"
        )
    return value


# RFC 1123 labels: letters, digits and inner hyphens, at most 63 each, 253 in all. A label
# never starts with `-` (so a host is never an ssh option) and a name holds no `@`, `:`, `/` or
# `%` (never a second user, a port, an ssh:// URL or a token ssh expands). The last label is
# not all digits (RFC 3696): `10.0.0.011` or `0x7f.1` are not addresses ipaddress accepts, and
# the resolver would read them as octal or hex addresses.
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
DNS_NAME = re.compile(rf"{_LABEL}(?:\.{_LABEL})*\.?")


def is_host(value: str) -> bool:
    """A DNS host name, an IPv4 address or an IPv6 address (without brackets or a zone)."""
    if "%" not in value:
        try:
            ipaddress.ip_address(value)
            return True
        except ValueError:
            pass
    if len(value) > 253 or not DNS_NAME.fullmatch(value):
        return False
    if value.rstrip(".").rsplit(".", 1)[-1].isdigit():
        return False
    return not _resolver_reads_as_address(value)


def _resolver_reads_as_address(name: str) -> bool:
    """Whether the C resolver would take `name` as an IPv4 address (inet_aton's forms: hex and
    octal parts, fewer than four parts, `0x7f000001`): not a name, and not the address
    ipaddress (hence every check here) saw."""
    for form in (name, name.rstrip(".")):
        try:
            socket.inet_aton(form)
            return True
        except (OSError, ValueError):
            pass
    return False


def check_host(value: str) -> str:
    if is_host(value):
        return value
    if DNS_NAME.fullmatch(value) and _resolver_reads_as_address(value):
        raise ValueError(
            f"{value!r} is not a host name: the resolver reads it as an IPv4 address (hex, "
            "octal or short form); write the address as four decimal numbers (a.b.c.d)"
        )
    raise ValueError(
        f"{value!r} is not a host name (dot-separated labels of letters, digits and inner "
        "-) or an IP address"
    )


def url_host(host: str) -> str:
    """The host as it appears in a URL: an IPv6 address goes in brackets."""
    return f"[{host}]" if ":" in host else host


# --- files on the controller ------------------------------------------------------------------

# ssh reads `-o UserKnownHostsFile=...` as a config line (whitespace separates files, quotes
# and backslashes are parsed, `#` starts a comment) and expands `%` tokens in both it and `-i`:
# a key or known_hosts path is plain path characters only, and never starts with `-`.
SSH_FILE = re.compile(r"[A-Za-z0-9._/~+][A-Za-z0-9._/~+-]{0,4095}")


def check_ssh_file(value: str) -> str:
    if not SSH_FILE.fullmatch(value):
        raise ValueError(
            f"{value!r} is not a plain file path (letters, digits and . _ / ~ + -, not "
            "starting with -): ssh would parse anything else"
        )
    return value


def check_controller_file(value: str) -> str:
    """A file the loader reads on the controller: one printable line, not an option."""
    problem = _control_problem(value, tab_ok=False)
    if problem:
        raise ValueError(f"a file path cannot contain {problem}")
    if not value or value.startswith("-"):
        raise ValueError(f"{value!r} is not a file path")
    return value


# --- URLs -------------------------------------------------------------------------------------

# An origin is scheme://host[:port] and nothing else: no credentials (they would be written to
# every member's `.env` as LOBES_MESH_SEEDS), no path, query or fragment, no comma (the seeds
# are a comma-separated list).
_ORIGIN = re.compile(r"(https?)://(\[[0-9A-Fa-f:.]+\]|[^\[\]/:]+)(?::([0-9]{1,5}))?")


def check_origin(value: str) -> str:
    shape = "must be http://HOST[:PORT] or https://HOST[:PORT], nothing more"
    problem = _control_problem(value, tab_ok=False)
    if problem:
        raise ValueError(f"{shape}; it contains {problem}")
    if "@" in value:
        raise ValueError(f"{shape}; credentials (user@) never go in an origin")  # not echoed
    found = _ORIGIN.fullmatch(value)
    if found is None:
        raise ValueError(f"{value!r} {shape}")
    host, port = found.group(2), found.group(3)
    if not is_host(host.removeprefix("[").removesuffix("]")) or (
        host.startswith("[") != (":" in host)
    ):
        raise ValueError(f"{value!r} {shape}; {host!r} is not a host name or an IP address")
    if port is not None and not 1 <= int(port) <= 65535:
        raise ValueError(f"{value!r} {shape}; port {port} is not in 1-65535")
    return value


# --- paths on a box ---------------------------------------------------------------------------


def check_home_path(value: str) -> str:
    """A path inside the deploy user's home, normalized to `~` or `~/a/b`.

    The box programs expand it with os.path.expanduser, so `~other/` would reach another
    user's home and an absolute path anything at all; the deploy user's home is not known
    here, so neither is accepted. A relative path is written as `~/...`, so it never depends on
    the directory a box program runs in. No `..` component: it could climb out of the home."""
    problem = _control_problem(value, tab_ok=False)
    if problem:
        raise ValueError(f"a path cannot contain {problem}")
    if value.startswith("/"):
        raise ValueError(f"{value!r} is absolute: write it inside the deploy user's home as ~/...")
    head, _, rest = value.partition("/")
    if head.startswith("~") and head != "~":
        raise ValueError(f"{value!r} names another user's home: only ~ or ~/... is allowed")
    parts = [p for p in (rest if head == "~" else value).split("/") if p not in ("", ".")]
    if ".." in parts:
        raise ValueError(f"{value!r} has a .. component: it must stay inside the home")
    if len(value) > 1024:
        raise ValueError("a path of more than 1024 characters")
    return "/".join(["~", *parts])


def check_inside_home(value: str) -> str:
    """A home path (normalized by check_home_path) that is not the home itself: the box
    (converge.py `_home_path`) takes only a path strictly inside it, for the deployment
    directory and a secret's file alike, and would refuse the whole converge for `~`."""
    if value == "~":
        raise ValueError("the home itself (~) is not a path inside it: write ~/...")
    return value


# --- `.env` values and what lands in them -----------------------------------------------------

MAX_ENV_VALUE = 65536  # converge.py `_env_value`'s bound


def check_env_value(value: Any) -> Any:
    """A value written to `.env` is one line of text: a NUL, CR or LF would end it early and
    start a line of the attacker's choosing. Other control characters are refused too (they
    are invisible in reports). The value itself is never echoed: it may be a secret."""
    if isinstance(value, str):
        problem = _control_problem(value)
        if problem:
            raise ValueError(f"an .env value cannot contain {problem} (the value is not shown)")
        # The box's writer (converge.py `quote`, `_env_value`) refuses these two at apply time:
        # single quotes would keep the `'`, double quotes would let compose expand the `$`.
        if "'" in value and "$" in value:
            raise ValueError(
                "an .env value cannot hold both ' and $: no quoting makes compose read it back "
                "unchanged (the value is not shown)"
            )
        if _escapes_closing_quote(value):
            raise ValueError(
                "an .env value without ' cannot end in an odd number of backslashes: the box "
                "writes it in single quotes, compose reads the last \\' as an escaped quote and "
                "refuses the whole .env as an unterminated quoted value (the value is not shown)"
            )
        if len(value) > MAX_ENV_VALUE:
            raise ValueError(f"an .env value longer than {MAX_ENV_VALUE} characters")
    return value


def _escapes_closing_quote(value: str) -> bool:
    """Whether compose (v2) cannot read back the single-quoted line the box writes for `value`.

    The box's writer (converge.py `quote`) puts a value holding no `'` (and not bare) in single
    quotes, untouched; compose's dotenv takes a `'` after an odd run of backslashes as an
    escaped quote, so `'C:\\models\\'` never ends (checked against `docker compose config`:
    `'a\\b'`, `'a\\\\'` and a backslash anywhere but at the end read back unchanged). A value
    holding `'` is written in double quotes with every backslash doubled, which reads back."""
    if "'" in value:
        return False
    run = len(value) - len(value.rstrip("\\"))
    return run % 2 == 1


# Hugging Face repository ids, as the hub enforces them: `name` or `namespace/name`, each part
# letters, digits, `.`, `_` and `-`, starting with a letter or digit, at most 96 characters,
# never `--` or `..`. vLLM reads a model id that exists as a path as a local directory, so no
# absolute path, `..` or third component is accepted.
_HF_PART = r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}"
MODEL_ID = re.compile(rf"(?:{_HF_PART}/)?{_HF_PART}")


def check_model_id(value: str) -> str:
    if not MODEL_ID.fullmatch(value) or "--" in value or ".." in value:
        raise ValueError(
            f"{value!r} is not a model id (name or namespace/name: letters, digits, . _ -, "
            "no -- or ..)"
        )
    return value


def check_image_ref(value: str) -> str:
    if not is_image_ref(value):
        raise ValueError(
            f"{value!r} is not an image reference ([registry[:port]/]path[:tag][@digest], "
            "lowercase path)"
        )
    return value


# A lane's or the gateway's `image:` names a catalog entry (checked against `images:` later)
# or is a literal reference (then it must be pinned by digest, also checked later).
_CATALOG_NAME = re.compile(r"[a-z][a-z0-9_\-]*")


def check_image_choice(value: str) -> str:
    if not (_CATALOG_NAME.fullmatch(value) or is_image_ref(value)):
        raise ValueError(
            f"{value!r} is neither a name from images: nor an image reference "
            "([registry[:port]/]path[:tag][@digest])"
        )
    return value


# Compose file names are joined to the deployment directory on the box and passed as `-f`:
# one plain file name ending in .yml/.yaml, never a path, never a leading `-` or `.`.
COMPOSE_FILE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,250}\.ya?ml")


def check_compose_file(value: str) -> str:
    if not COMPOSE_FILE.fullmatch(value):
        raise ValueError(
            f"{value!r} is not a compose file name (letters, digits, _ . -, ending in .yml or "
            ".yaml, no /)"
        )
    return value


# Globs of variable names (secret_patterns, login_shell.forbidden): the characters of a name
# plus fnmatch's * ? [ ] !. They travel to the boxes and are matched there.
VAR_GLOB = re.compile(r"[A-Za-z0-9_*?\[\]!-]{1,128}")


def check_var_glob(value: str) -> str:
    if not VAR_GLOB.fullmatch(value):
        raise ValueError(
            f"{value!r} is not a glob of variable names (letters, digits, _ and * ? [ ] ! -)"
        )
    return value


# MODEL_GEAR_VERSION, pinned by `pip install lobes-cli==...`: ASCII digits only (`\d` would
# also take other scripts' digits).
VERSION = re.compile(r"[0-9]{1,9}\.[0-9]{1,9}\.[0-9]{1,9}")


def check_version(value: str) -> str:
    if not VERSION.fullmatch(value):
        raise ValueError(f"{value!r} is not a version MAJOR.MINOR.PATCH (digits only)")
    return value


def check_ipv4(value: str) -> str:
    try:
        ipaddress.IPv4Address(value)
    except ValueError:
        raise ValueError(f"{value!r} is not an IPv4 address") from None
    return value


def check_text(value: str) -> str:
    """Free text shown in reports (a reason): one line, no terminal escapes."""
    problem = _control_problem(value)
    if problem:
        raise ValueError(f"text shown in reports cannot contain {problem}")
    return value


UserName = Annotated[
    str,
    AfterValidator(check_user_name),
    _schema({"pattern": r"^[a-z_][a-z0-9_-]{0,31}$", "description": "a POSIX user name"}),
]
Host = Annotated[
    str,
    AfterValidator(check_host),
    _schema({"description": "a DNS host name, an IPv4 address or an IPv6 address (no brackets)"}),
]
SshFile = Annotated[
    str,
    AfterValidator(check_ssh_file),
    _schema(
        {"pattern": r"^[A-Za-z0-9._/~+][A-Za-z0-9._/~+-]*$", "description": "a plain file path"}
    ),
]
ControllerFile = Annotated[
    str, AfterValidator(check_controller_file), _schema({"description": "a file on the controller"})
]
HttpOrigin = Annotated[
    str,
    AfterValidator(check_origin),
    _schema({"pattern": r"^https?://[^/@?#,]+$", "description": "http(s)://HOST[:PORT]"}),
]
HomePath = Annotated[
    str,
    AfterValidator(check_home_path),
    _schema({"description": "a path inside the deploy user's home: ~ or ~/... (no ..)"}),
]
InsideHome = Annotated[
    str,
    AfterValidator(check_home_path),
    AfterValidator(check_inside_home),
    _schema({"description": "a path inside the deploy user's home: ~/... (no ..)"}),
]
ModelId = Annotated[
    str,
    AfterValidator(check_model_id),
    _schema({"pattern": r"^([A-Za-z0-9][A-Za-z0-9._-]*/)?[A-Za-z0-9][A-Za-z0-9._-]*$"}),
]
ImageRef = Annotated[
    str,
    AfterValidator(check_image_ref),
    _schema({"description": "[registry[:port]/]path[:tag][@digest]"}),
]
ImageChoice = Annotated[
    str,
    AfterValidator(check_image_choice),
    _schema({"description": "a name from images: or a repo@sha256 reference"}),
]
ComposeFile = Annotated[
    str,
    AfterValidator(check_compose_file),
    _schema({"pattern": r"^[A-Za-z0-9_][A-Za-z0-9_.-]*\.ya?ml$"}),
]
VarGlob = Annotated[
    str, AfterValidator(check_var_glob), _schema({"pattern": r"^[A-Za-z0-9_*?\[\]!-]+$"})
]
Version = Annotated[
    str, AfterValidator(check_version), _schema({"pattern": r"^[0-9]+\.[0-9]+\.[0-9]+$"})
]
IPv4 = Annotated[str, AfterValidator(check_ipv4), _schema({"format": "ipv4"})]
Text = Annotated[str, AfterValidator(check_text), _schema({})]
