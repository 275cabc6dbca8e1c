"""Variants of this repository's own desired-state YAML, for the generated-input test
(test_generated_inputs.py) and the figures script (scripts/yaml_limits_report.py).

A variant is one file of a copy of the repository replaced by a mutation of itself: at the text
level (truncated, bytes inserted, lines duplicated or re-indented, an anchor, alias, tag, merge
key, deep nesting, control character or surrogate injected at a real `key: value` line) or at
the data level (a value replaced by another type, an option-like string, a string with CR/LF/
NUL, a path with `..`, a huge number, a required key deleted, an unknown key added, then dumped
back to YAML). Some mutations must be refused whatever else holds; a variant says so and why.

Choices come from a `Draw` (hypothesis in the test, random.Random in the script), so one
generator serves both and hypothesis can shrink a failure to its smallest variant.
"""

from __future__ import annotations

import copy
import io
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

from ruamel.yaml import YAML

from reconciler.desired.safe_read import INVENTORY_MAX_BYTES, MAX_BYTES

ROOT = Path(__file__).resolve().parents[2]
T = TypeVar("T")

# The lab writes these two kinds of files (`reconcile lab up`); the copy gets stand-ins of the
# same shape so the lab inventory's overlays load too.
LAB_IMAGES = "".join(
    f"{name}: 10.77.0.1:5000/lobes/{name}@sha256:{digit * 64}\n"
    for name, digit in (("gateway", "a"), ("vllm_gemma4", "b"), ("vllm_nightly", "c"))
)
LAB_OVERLAY = "deployment:\n  file_digests:\n    docker-compose.override.yml: " + "d" * 64 + "\n"
BOXES = ("thor", "spark", "orin")


class Draw(Protocol):
    def integer(self, low: int, high: int) -> int: ...
    def choice(self, options: Sequence[T]) -> T: ...


@dataclass(frozen=True)
class Variant:
    file: str  # relative to the repository root
    content: bytes
    inventory: str  # the inventory that reads the file (hosts, lab, lab-controller)
    kind: str  # the mutation's name
    must_refuse: str | None  # why this variant can never be a valid desired state


def make_repo(target: Path) -> Path:
    """A copy of the repository's desired state (and stand-ins for the lab's facts)."""
    for part in ("inventory", "group_vars"):
        shutil.copytree(ROOT / part, target / part)
    (target / ".lab" / "overlay").mkdir(parents=True)
    (target / ".lab" / "images.yaml").write_text(LAB_IMAGES, encoding="utf-8")
    for box in BOXES:
        (target / ".lab" / "overlay" / f"{box}.yaml").write_text(LAB_OVERLAY, encoding="utf-8")
    return target


def corpus(root: Path) -> dict[str, bytes]:
    """Every desired-state file of the copy, by path relative to it."""
    files = [
        *sorted((root / "inventory").rglob("*.yaml")),  # inventories and their box layers
        *sorted((root / "group_vars").glob("*.yaml")),
        root / ".lab" / "images.yaml",
        *sorted((root / ".lab" / "overlay").glob("*.yaml")),
    ]
    return {str(p.relative_to(root)): p.read_bytes() for p in files}


def _inventory(path: str) -> bool:
    return path.startswith("inventory/") and path.count("/") == 1


def variant(draw: Draw, originals: dict[str, bytes]) -> Variant:
    file = draw.choice(sorted(originals))
    text = originals[file].decode("utf-8")
    # The inventory that reads the file: its own, the one whose box layers live under
    # inventory/<name>/, the lab's for its facts; any of them for a group_vars layer.
    inventories = sorted(p.removeprefix("inventory/")[:-5] for p in originals if _inventory(p))
    parts = file.split("/")
    if _inventory(file):
        inventory = parts[1][:-5]
    elif parts[0] == "inventory":
        inventory = parts[1]
    elif parts[0] == ".lab":
        inventory = "lab"
    else:
        inventory = draw.choice(inventories)
    level = draw.choice(("text", "text", "inject", "data", "targeted"))
    if level == "text":
        kind, content, why = _text_mutation(draw, text)
    elif level == "inject":
        kind, content, why = _injection(draw, text, file)
    elif level == "data":
        kind, content, why = _data_mutation(draw, text)
    else:
        kind, content, why = _targeted(draw, text, file)
    return Variant(file, content, inventory, f"{level}:{kind}", why)


# -- text level: anything can happen, nothing is claimed ----------------------------------------
def _text_mutation(draw: Draw, text: str) -> tuple[str, bytes, str | None]:
    data = text.encode("utf-8")
    lines = text.splitlines(keepends=True)
    kind = draw.choice(
        ("truncate", "insert_bytes", "insert_char", "dup_line", "drop_line", "indent", "swap")
    )
    if kind == "truncate":
        return kind, data[: draw.integer(0, len(data))], None
    if kind == "insert_bytes":
        at = draw.integer(0, len(data))
        noise = bytes(draw.integer(0, 255) for _ in range(draw.integer(1, 6)))
        return kind, data[:at] + noise + data[at:], None
    if kind == "insert_char":
        at = draw.integer(0, len(text))
        char = draw.choice(_ODD_CHARS)
        return kind, _encode(text[:at] + char + text[at:]), None
    index = draw.integer(0, max(0, len(lines) - 1))
    if not lines:
        return kind, data, None
    if kind == "dup_line":
        lines.insert(index, lines[index])
    elif kind == "drop_line":
        del lines[index]
    elif kind == "indent":
        body = lines[index].lstrip(" ")
        lines[index] = draw.choice(("", " ", "   ", "\t", " " * 8, " " * 33)) + body
    else:
        other = draw.integer(0, len(lines) - 1)
        lines[index], lines[other] = lines[other], lines[index]
    return kind, _encode("".join(lines)), None


_ODD_CHARS = (
    "\x00",
    "\x1b",
    "\x07",
    "\x7f",
    "\x85",
    "\x9b",
    "\ud800",
    "\udfff",
    "\ufeff",
    "\ufffe",
    "\u2028",
    "\r",
    "\t",
    "\n",
    "'",
    '"',
    "[",
    "{",
    ":",
    "#",
    "&",
    "*",
    "!",
    "%",
    "@",
    "`",
    "|",
    ">",
    "-",
    "?",
    ",",
    "é",
    "\U0001f600",
)


def _encode(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")  # a lone surrogate as the bytes it would be


# -- injections at a real `key: value` line: each must be refused -------------------------------
_PLAIN_LINE = r"^( *)([A-Za-z_][\w.\-]*):( +)([^'\"\[\]{}>|&*!#%@`\s][^#]*?)( +#.*)?$"


def _entry_lines(text: str) -> list[int]:
    import re

    pattern = re.compile(_PLAIN_LINE)
    return [i for i, line in enumerate(text.splitlines()) if pattern.match(line)]


def _injection(draw: Draw, text: str, file: str) -> tuple[str, bytes, str | None]:
    import re

    lines = text.splitlines(keepends=True)
    entries = _entry_lines(text)
    kind = draw.choice(
        (
            "anchor",
            "alias",
            "bomb",
            "tag",
            "merge_key",
            "deep",
            "inf",
            "escape",
            "dup_key",
            "int_key",
            "bool_key",
            "null_key",
            "directive",
            "second_doc",
            "raw_control",
            "bad_utf8",
            "oversize",
            "empty",
        )
    )
    if kind in ("directive", "second_doc", "raw_control", "bad_utf8", "oversize", "empty"):
        return kind, *_whole_file(draw, kind, text, file)
    if not entries:
        return kind, _encode(text), None
    index = draw.choice(entries)
    match = re.match(_PLAIN_LINE, lines[index].rstrip("\r\n"))
    assert match is not None
    indent, key, space, value = match.group(1), match.group(2), match.group(3), match.group(4)
    head = f"{indent}{key}:{space}"
    if kind == "anchor":
        new = f"{head}&a {value}\n"
    elif kind == "alias":
        new = f"{head}*a\n"
    elif kind == "bomb":
        new = f"{head}&a [x, x, x, x, x, x, x, x, x]\n" + "".join(
            f"{indent}{key}{n}: &{chr(98 + n)} [{', '.join([f'*{chr(97 + n)}'] * 9)}]\n"
            for n in range(draw.integer(1, 9))
        )
    elif kind == "tag":
        tag = draw.choice(
            (
                "!!python/object/apply:os.system",
                "!!python/name:os.system",
                "!!binary",
                "!!set",
                "!!omap",
                "!!timestamp",
                "!local",
                "!<tag:example.com,2000:x>",
                "!!merge",
            )
        )
        new = f"{head}{tag} {value}\n"
    elif kind == "merge_key":
        new = f"{indent}<<: {{zz: 1}}\n{lines[index]}"
    elif kind == "deep":
        depth = draw.choice((33, 40, 100, 900, 3000))
        new = f"{head}{'[' * depth}{']' * depth}\n"
    elif kind == "inf":
        new = f"{head}{draw.choice(('.inf', '-.inf', '.nan', '.NaN', '1e400', '-1e999'))}\n"
    elif kind == "escape":
        escape = draw.choice(("ud800", "0", "e", "x9b", "udfff"))
        new = f'{head}"\\{escape}"\n'
    elif kind == "dup_key":
        new = lines[index].rstrip("\r\n") + "\n" + lines[index].rstrip("\r\n") + "\n"
    else:
        other = {"int_key": "12", "bool_key": draw.choice(("true", "False")), "null_key": "~"}
        new = f"{indent}{other[kind]}:{space}{value}\n"
    lines[index] = new
    return kind, _encode("".join(lines)), kind


def _whole_file(draw: Draw, kind: str, text: str, file: str) -> tuple[bytes, str | None]:
    data = text.encode("utf-8")
    if kind == "directive":
        return b"%YAML 1.1\n---\n" + data, kind
    if kind == "second_doc":
        return data + b"---\nlobes: {}\n", kind
    if kind == "raw_control":
        at = draw.integer(0, len(data))
        return data[:at] + draw.choice((b"\x00", b"\x1b", b"\x7f", b"\xc2\x9b")) + data[at:], kind
    if kind == "bad_utf8":
        at = draw.integer(0, len(data))
        return data[:at] + draw.choice((b"\xff", b"\xed\xa0\x80", b"\xc3")) + data[at:], kind
    if kind == "oversize":  # past the limit of what the file is: an inventory, or a layer
        limit = INVENTORY_MAX_BYTES if _inventory(file) else MAX_BYTES
        return data + b"#" + b"x" * limit + b"\n", kind
    # An empty file: the inventory must hold boxes; an empty layer is just empty.
    blank = draw.choice((b"", b"# nothing\n", b"~\n", b"---\n"))
    return blank, ("empty inventory" if _inventory(file) else None)


# -- data level ----------------------------------------------------------------------------------
def _load(text: str) -> Any:
    return YAML(typ="safe", pure=True).load(text)


def _dump(data: Any) -> bytes:
    out = io.StringIO()
    yaml = YAML(typ="safe", pure=True)
    yaml.default_flow_style = False
    yaml.dump(data, out)
    return out.getvalue().encode("utf-8")


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = []
    if isinstance(node, dict):
        for key, value in node.items():
            out.append((*prefix, key))
            out += _paths(value, (*prefix, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            out.append((*prefix, index))
            out += _paths(value, (*prefix, index))
    return out


def _parent(data: Any, path: tuple[Any, ...]) -> Any:
    for part in path[:-1]:
        data = data[part]
    return data


_VALUES: tuple[Any, ...] = (
    0,
    -1,
    2**63,
    10**30,
    1e308,
    0.5,
    True,
    None,
    "",
    "x",
    [],
    {},
    [1, "a"],
    {"k": "v"},
    "-oProxyCommand=touch /tmp/x",
    "--help",
    "a\nb",
    "a\r\nb",
    "a\x00b",
    "../../etc/passwd",
    "~/../../root",
    "http://evil/\r\nX: y",
    "2024-01-01",
    "yes",
    "1e400",
)


def _data_mutation(draw: Draw, text: str) -> tuple[str, bytes, str | None]:
    data = _load(text)
    if not isinstance(data, dict) or not data:
        return "none", _encode(text), None
    paths = _paths(data)
    path = draw.choice(paths)
    parent = _parent(data, path)
    kind = draw.choice(("replace", "delete", "unknown_key"))
    if kind == "replace":
        parent[path[-1]] = draw.choice(_VALUES)
        return kind, _dump(data), None
    if kind == "delete":
        del parent[path[-1]]
        return kind, _dump(data), None
    mappings = [p for p in [(), *paths] if isinstance(_get(data, p), dict)]
    target = _get(data, draw.choice(mappings))
    target["zz_unknown_key"] = 1
    return kind, _dump(data), "unknown key"


def _get(data: Any, path: tuple[Any, ...]) -> Any:
    for part in path:
        data = data[part]
    return data


# -- targeted: a typed field given what its type must refuse ------------------------------------
_OPTION_LIKE = ("-oProxyCommand=touch /tmp/x", "-F/dev/null", "--", "-l root")


def _targeted(draw: Draw, text: str, file: str) -> tuple[str, bytes, str | None]:
    data = _load(text)
    if _inventory(file):
        return _targeted_inventory(draw, data)
    box = file.removeprefix("group_vars/").removesuffix(".yaml")
    if box not in BOXES or not isinstance(data, dict):
        return "none", _encode(text), None  # a group layer may be overridden by a box layer
    return _targeted_box(draw, data)


def _targeted_inventory(draw: Draw, data: dict[str, Any]) -> tuple[str, bytes, str | None]:
    box = draw.choice(BOXES)
    entry = data["boxes"][box]
    kind = draw.choice(
        ("ssh_user", "ssh_hostname", "gateway_origin", "delete_ssh_user", "huge_port")
    )
    if kind == "delete_ssh_user":
        del entry["ssh_user"]
        return kind, _dump(data), "required ssh_user deleted"
    if kind == "huge_port":
        entry["ssh_port"] = draw.choice((10**30, 2**64, 65536, 0, -1))
        return kind, _dump(data), "port out of range"
    if kind == "gateway_origin":
        entry[kind] = draw.choice(
            ("-oProxyCommand=x", "ftp://x", "http://h\r\nX: y", "http://h\x00", "javascript:x")
        )
        return kind, _dump(data), "gateway_origin not an http(s) URL"
    entry[kind] = draw.choice(
        (*_OPTION_LIKE, "a b", "x\ny", "x\x00", "", "root;touch /tmp/x")
        if kind == "ssh_user"
        else (*_OPTION_LIKE, "a b", "x\ny", "x\x00", "", "host;touch /tmp/x")
    )
    return kind, _dump(data), f"{kind} refused by its type"


def _targeted_box(draw: Draw, data: dict[str, Any]) -> tuple[str, bytes, str | None]:
    kind = draw.choice(
        ("directory", "secret_path", "env_value", "lane_env_value", "model", "served_name", "huge")
    )
    line_break = draw.choice(("a\nb", "a\rb", "a\r\nb", "a\x00b", "\nX=1"))
    if kind == "directory":
        data.setdefault("deployment", {})["directory"] = draw.choice(
            ("~/../x", "~/a/../../b", "/etc/..", "../x", "~/.lobes/..")
        )
        return kind, _dump(data), "directory with .."
    if kind == "secret_path":
        data.setdefault("secrets", {})["gateway_api_key"] = {
            "source": "box_file",
            "path": draw.choice(("~/../x.env", "~/.lobes/../../etc/shadow", "../s.env")),
            "key": "GATEWAY_API_KEY",
        }
        return kind, _dump(data), "secret path with .."
    if kind == "env_value":
        data.setdefault("env", {})["ZZ_VALUE"] = line_break
        return kind, _dump(data), "env value with CR/LF/NUL"
    if kind == "huge":
        key = draw.choice(("gpu_memory_budget", "heartbeat"))
        if key == "heartbeat":
            data.setdefault("mesh", {})["heartbeat_s"] = draw.choice((10**30, 2**64, 1e400))
        else:
            data[key] = draw.choice((1e400, 10**30, float("inf")))
        return kind, _dump(data), "huge number"
    lane = draw.choice(("embed", "rerank", "hand"))
    lanes = data.setdefault("lanes", {})
    if kind == "lane_env_value":
        lanes.setdefault(lane, {}).setdefault("env", {})["ZZ_VALUE"] = line_break
        return kind, _dump(data), "lane env value with CR/LF/NUL"
    lanes.setdefault(lane, {})[kind] = line_break
    return kind, _dump(data), f"{kind} with CR/LF/NUL"


# -- the check every variant must pass -----------------------------------------------------------
@dataclass(frozen=True)
class Outcome:
    accepted: bool
    problems: tuple[str, ...]  # str(problem) of each
    unlocated: tuple[str, ...]  # problems without a FILE:LINE that exists


def parse_unchanged_once(real: Callable[..., Any]) -> Callable[..., Any]:
    """The loader's `load_yaml`, remembering each unchanged file's parse (a copy is handed out):
    only the mutated file goes through the real parser every time, which keeps 1,000 loads near
    a minute. Shared by the test and scripts/yaml_limits_report.py."""
    seen: dict[tuple[str, bytes], Any] = {}

    def load_yaml(path: Path, display: str, **kwargs: Any) -> Any:
        try:
            key = (str(path), path.read_bytes())
        except OSError:
            return real(path, display, **kwargs)
        if key not in seen:
            seen[key] = real(path, display, **kwargs)
        return copy.deepcopy(seen[key])

    return load_yaml


def judge(root: Path, problems: Sequence[Any], case: Variant) -> Outcome:
    """Each problem must name a file of the repository and a line that file has (the mutated
    file as the variant has it)."""
    unlocated = []
    for problem in problems:
        where = problem.location
        path = root / where.file
        try:
            data = case.content if where.file == case.file else path.read_bytes()
        except OSError:
            data = None
        last = (data.count(b"\n") + 1) if data is not None else 0
        located = data is not None and 1 <= where.line <= last and where.column >= 1
        # "parser failed" is the loader's last-resort catch: a traceback in disguise
        if not located or "parser failed" in problem.message:
            unlocated.append(str(problem))
    return Outcome(not problems, tuple(str(p) for p in problems), tuple(unlocated))


LoadFn = Callable[[Path, str], Any]
