"""Write a layer as YAML through ruamel's round-trip dumper, every value followed by a short
comment saying where it was found (`# .env:61`, `# docker inspect`, `# GET /capabilities`)."""

from __future__ import annotations

import io
import sys
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq

from reconciler.importer.sourced import Sourced, Tree

# Top-level keys in the order a reader of group_vars/all.yaml expects them.
ORDER = (
    "lobes",
    "deployment",
    "images",
    "secrets",
    "secret_patterns",
    "login_shell",
    "memory",
    "gpu_memory_budget",
    "gateway",
    "mesh",
    "env",
    "lanes",
    "contract",
)
MAX_COMMENT = 100


def _flow(value: Any) -> Any:
    """A leaf's value: lists and small mappings on one line (`[a, b]`, `{secret: x}`)."""
    if isinstance(value, list):
        seq = CommentedSeq(value)
        seq.fa.set_flow_style()
        return seq
    if isinstance(value, dict):
        inner = CommentedMap(value)
        inner.fa.set_flow_style()
        return inner
    return value


def _comment(origin: str) -> str:
    text = " ".join(origin.split())  # one line, whatever a box wrote
    return text if len(text) <= MAX_COMMENT else text[: MAX_COMMENT - 3] + "..."


def _map(tree: Tree, top: bool = False) -> CommentedMap:
    out = CommentedMap()
    keys = list(tree)
    if top:
        keys = [k for k in ORDER if k in tree] + sorted(k for k in tree if k not in ORDER)
    for key in keys:
        node = tree[key]
        if isinstance(node, Sourced):
            out[key] = _flow(node.value)
            out.yaml_add_eol_comment(_comment(node.origin), key)
        else:
            out[key] = _map(node)
    return out


def dump_layer(tree: Tree, header: str) -> str:
    yaml = YAML()  # round-trip: keeps the comments attached above
    # A long .env value stays on its line: ruamel folds a plain scalar wider than this at a
    # blank, and a folded run of blanks reads back one short. No width a value can reach.
    yaml.width = sys.maxsize
    yaml.indent(mapping=2, sequence=4, offset=2)
    # `KEY: null` (leave it out of .env) said in words: ruamel's default writes nothing.
    yaml.representer.add_representer(
        type(None), lambda r, _: r.represent_scalar("tag:yaml.org,2002:null", "null")
    )
    buffer = io.StringIO()
    for line in header.splitlines():
        buffer.write(f"# {line}\n" if line else "#\n")
    yaml.dump(_map(tree, top=True), buffer)
    return buffer.getvalue()
