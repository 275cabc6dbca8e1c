"""Editing a lobes `.env` the way an operator does: change a value in place, keep the rest.

lobes' `.env` is merge-only and carries `KEY=value   # comment` lines; an edit replaces the
value of the LAST active `KEY=` line (the one compose uses), keeps its inline comment, and
appends the key at the end when only commented-out examples exist. Values written here are
single tokens (refs, keys, origins, numbers), so no quoting is needed.
"""

from __future__ import annotations

import re

_ACTIVE = re.compile(r"^(?P<key>[A-Za-z_][A-Za-z0-9_]*)=(?P<value>\S*)(?P<comment>\s+#.*)?$")


def get(text: str, key: str) -> str | None:
    found = None
    for line in text.splitlines():
        m = _ACTIVE.match(line)
        if m and m["key"] == key:
            found = m["value"]
    return found


def set_keys(text: str, values: dict[str, str], *, block_title: str = "fleet lab") -> str:
    lines = text.splitlines()
    last: dict[str, int] = {}
    for i, line in enumerate(lines):
        m = _ACTIVE.match(line)
        if m and m["key"] in values:
            last[m["key"]] = i
    appended = []
    for key, value in values.items():
        if key in last:
            m = _ACTIVE.match(lines[last[key]])
            assert m is not None
            lines[last[key]] = f"{key}={value}{m['comment'] or ''}"
        else:
            appended.append(f"{key}={value}")
    if appended:
        header = f"# --- {block_title} ---"
        if header not in lines:
            lines += ["", header]
        lines += appended
    return "\n".join(lines) + "\n"
