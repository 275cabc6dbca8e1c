"""The C path (yaml_fast.py) and the located loader read every file the same.

Property, for any text: reading it the usual way (libyaml's events first, the located loader
for anything not plain) gives exactly what the located loader alone gives: the same data and
the same position of every key and item, or the same problems, word for word. And the C path
answers for every plain file of the repository, so the speed it exists for is really had.

Inputs: every YAML file of the repository, a hand-written list of what plain YAML does and does
not allow (each refusal of yaml_source.py, and the corners where YAML 1.1's libyaml and YAML
1.2's ruamel scanners could part: escapes, tabs, flow keys, chomping, CRLF, long keys), then
generated variants: tests/unit/yaml_mutations.py's mutations of the repository's own files and
random YAML punctuation dropped into them.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reconciler.desired import yaml_fast
from reconciler.desired.problems import DesiredStateError
from reconciler.desired.yaml_source import MAX_DEPTH, MAX_NODES, SourceDoc, _decode, parse_text

from .test_generated_inputs import (
    HypothesisDraw,
    reproducible,
    same_variants_whatever_ran_before,
)
from .yaml_mutations import ROOT, corpus, make_repo, variant

EXAMPLES = 1500


def _outcome(text: str, located_only: bool, inventory: bool = False) -> Any:
    try:
        doc: SourceDoc = parse_text(
            text, "f.yaml", required="a mapping", inventory=inventory, located_only=located_only
        )
    except DesiredStateError as exc:
        return ("refused", [str(p) for p in exc.problems])
    return ("read", doc.data, list(doc.positions.items()))


def assert_same(text: str, inventory: bool = False) -> None:
    usual, located = _outcome(text, False, inventory), _outcome(text, True, inventory)
    assert usual == located, text[:300]


def _repository_yaml() -> list[Path]:
    skip = {".git", ".venv", "node_modules", ".lab"}
    return sorted(
        p
        for pattern in ("*.yaml", "*.yml")
        for p in ROOT.rglob(pattern)
        if not skip & set(p.relative_to(ROOT).parts)
    )


def test_the_c_extension_is_installed() -> None:
    """A dependency of this package: without it every file would silently take the slow path."""
    assert yaml_fast.available()


@pytest.mark.parametrize("path", _repository_yaml(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_yaml_file_of_the_repository_reads_the_same_and_the_c_path_answers(
    path: Path,
) -> None:
    text = _decode(path.read_bytes(), path.name)
    inventory = path.parent.name == "inventory"
    assert_same(text, inventory)
    located = _outcome(text, True, inventory)
    if located[0] == "read" and located[1]:
        plain = yaml_fast.plain_source(text, "f.yaml", max_nodes=10**5, max_depth=MAX_DEPTH)
        assert plain is not None, f"{path} is plain YAML the C path did not read"


def _nested(levels: int, flow: bool) -> str:
    if flow:
        return "a: " + "[" * levels + "]" * levels + "\n"
    return "".join(f"{'  ' * i}k{i}:\n" for i in range(levels)) + f"{'  ' * levels}v: 1\n"


# Plain, as the repository writes it: the C path must read each of these itself.
PLAIN = [
    "a: 1\nb: [x, 'y', \"z\"]\nc: {d: e, f: null}\n",
    "list:\n- a\n- b: 1\n  c: 2\n-\n  - nested\n- [x, {y: z}]\n",
    "t: true\nf: False\nn: NULL\ni: 0x1F\no: 0o17\nfl: 1.5e3\nd: 2024-01-01\ny: yes\nmerge: <<\n",
    "big: 9223372036854775807\nneg: -9223372036854775808\nunder: 1_000\nplus: +3\nsci: 1e3\n",
    "folded: >-\n  one\n  two\n\n  three\nliteral: |+\n  keep\n\nstrip: |2-\n    indented\n",
    "multi: plain words\n  continued here\nnext: 1\n",
    "'quoted key': 1\n\"dq key\": 2\n? explicit\n: 3\n",
    "flow: {a, b: , c: d,}\nseq: [a, b, ]\nempty: {}\nnone: []\n",
    "crlf: 1\r\nnext:\r\n  - x\r\n",
    "---\na: 1\n...\n",
    "# only a comment\na: 1 # trailing\nb: 'x' #c\nc: x#y\n",
    'a: "' + "x" * 2000 + '"\n',
    "a: 'it''s'\nb: \"\\x41\\u263A \\/ \\_ \\L \\P \\t \\u00e9\"\n",
    "a: b\n  - c\n",
    "url: http://x:8000/v1\nport: '8000:8000'\n",
    _nested(MAX_DEPTH - 1, True),
    "a: [" + ", ".join(["1"] * (MAX_NODES - 3)) + "]\n",
]
HAND_WRITTEN = [
    *PLAIN,
    # read by the located loader, where the C path may defer (tabs, explicit tags, flow `a:b`)
    "colon: a:b\nflowcolon: [a:b, 'c:d']\n",
    "k" * 1100 + ": long key\n",
    "tab:\tvalue\nsep: a\t b\n",
    "\ttabbed: 1\n",
    "a:\n\t- x\n",
    "a: !!str 1\nb: !!int '2'\nc: !!float 3\nd: !!bool true\ne: !!null ''\n",
    "a: !!int x\nb: !!bool yes\n",
    'env:\n  B: "esc \\N"\n',
    "a: 1\n\ufeff",
    "a: b\ufeff\nc: \ufeffd\n",
    "a:\n  \ufeffb: 1\n",
    "a: |# no space before the comment\n  x\n",
    "a: >-#\n  x\n",
    "a: >-\n \n   deeper than the blank line above\n",
    "a: >-\n   \n  shallower than the blank line above\n",
    "a: |2\n \n   explicit indentation\n",
    "a: |-  # a comment\n  x\nb: >+ \n\n  y\n\n",
    "? |\n  block key\n: v\n",
    # refused: each one of yaml_source.py's refusals
    "a: &x 1\nb: *x\n",
    "a: *missing\n",
    "<<: {a: 1}\n",
    "%YAML 1.1\n---\na: yes\n",
    "%TAG !e! tag:example.com,2000:\n---\na: !e!x 1\n",
    "a: !!set {x}\n",
    "a: !vault secret\n",
    "a: !!python/object:os.system x\n",
    "a: 1\n---\nb: 2\n",
    "1: x\n",
    "true: x\n",
    "~: x\n",
    "[a]: x\n",
    "? {a: 1}\n: x\n",
    "a: 1\na: 2\n",
    'a: "\\x01"\n',
    'a: "\\ud800"\n',
    'a: "\\x85"\n',
    '"k\\x01": 1\n',
    '"k\\tk": 1\n',
    "a: .inf\nb: -.Inf\nc: .nan\n",
    "a: 1e400\n",
    "a: 99999999999999999999\n",
    "a: 0x" + "f" * 70 + "\n",
    _nested(MAX_DEPTH, True),
    _nested(MAX_DEPTH - 1, True),
    _nested(MAX_DEPTH + 5, False),
    _nested(900, True),
    "a: [" + ", ".join(["1"] * (MAX_NODES + 5)) + "]\n",
    "a: [" + ", ".join(["1"] * (MAX_NODES - 3)) + "]\n",
    "",
    "# nothing\n",
    "---\n~\n",
    "just a scalar\n",
    "- a list\n",
    "a: [unclosed\n",
    "a: {b: 1\n",
    "a: 'unterminated\n",
    "a:\n  b: 1\n c: 2\n",
    "a: b: c\n",
    "a: @reserved\n",
    "a: `tick\n",
    "- a\nb: 1\n",
    "a: |\n  x\n y\n",
    'a: "\\z"\n',
    "a: b\n  - c\n",
]


@pytest.mark.parametrize("text", HAND_WRITTEN, ids=range(len(HAND_WRITTEN)))
def test_hand_written_corners_read_the_same(text: str) -> None:
    assert_same(text)
    assert_same(text, inventory=True)


def test_the_c_path_reads_the_plain_corners_itself() -> None:
    """Not only agreement by always deferring: plain YAML is read by the C path."""
    for text in PLAIN:
        assert _outcome(text, True)[0] == "read", text[:80]
        got = yaml_fast.plain_source(text, "f.yaml", max_nodes=MAX_NODES, max_depth=MAX_DEPTH)
        assert got is not None, text[:80]


@pytest.fixture(scope="module")
def originals(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, bytes]]:
    root = make_repo(tmp_path_factory.mktemp("yaml-fast") / "fleet")
    yield corpus(root)


_PUNCTUATION = [
    *":-?,[]{}#&*!|>'\"%@`\t\r\n \\",
    ": ",
    "- ",
    "? ",
    "\n  ",
    "\n- ",
    "'",
    '"\\',
    "\u00a0",
    "\u2028",
    "\ufeff",
    "\x85",
    "é",
    "0x",
    ".inf",
    "~",
    "<<",
    "---\n",
    "...\n",
    "|",
    ">",
    "|-",
    ">+",
    "|2",
    ">-#",
    "\n \n",
    "\n    \n",
]


@pytest.mark.usefixtures(same_variants_whatever_ran_before.__name__)
def test_generated_variants_read_the_same(originals: dict[str, bytes]) -> None:
    ran: list[str] = []

    @reproducible(EXAMPLES)
    @given(st.data())
    def check(data: Any) -> None:
        draw = HypothesisDraw(data)
        if draw.choice(("mutation", "punctuation")) == "mutation":
            case = variant(draw, originals)
            content, inventory = case.content, case.file.count("/") == 1
        else:
            file = draw.choice(sorted(originals))
            content, inventory = originals[file], file.count("/") == 1
            for _ in range(draw.integer(1, 4)):
                at = draw.integer(0, len(content))
                noise = draw.choice(_PUNCTUATION).encode("utf-8", "surrogatepass")
                content = content[:at] + noise + content[at:]
        try:
            text = _decode(content, "f.yaml")
        except DesiredStateError:
            return  # refused before either path parses
        assert_same(text, inventory)
        ran.append("x")

    check()
    assert len(ran) >= EXAMPLES // 2
