"""Where a box program opens files: every use of `open`, `os.open`, `io.open`, `Path.open`,
`.read_text` or `.read_bytes` in its source, so a test can hold each program to its one bounded
reader (a FIFO, a device or a huge file read any other way hangs or floods the box's run)."""

from __future__ import annotations

import ast

OPENERS = {"open", "read_text", "read_bytes"}  # `open`, `os.open`, `io.open`, `Path.open`...


def opens(source: str) -> list[tuple[str, str]]:
    """(the enclosing function's dotted name, its source) of every use of an opener in the
    program `source`: a call shown whole (`os.open(path, flags)`), any other use as it is."""
    tree = ast.parse(source)
    calls = {id(node.func): node for node in ast.walk(tree) if isinstance(node, ast.Call)}
    found: list[tuple[str, str]] = []

    def visit(node: ast.AST, where: list[str]) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                visit(child, [*where, child.name])
                continue
            used = (isinstance(child, ast.Name) and child.id in OPENERS) or (
                isinstance(child, ast.Attribute) and child.attr in OPENERS
            )
            if used:
                whole = calls.get(id(child), child)
                found.append((".".join(where), str(ast.get_source_segment(source, whole))))
            visit(child, where)

    visit(tree, [])
    return found
