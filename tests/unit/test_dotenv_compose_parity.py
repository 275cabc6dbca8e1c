"""Both box-side `.env` readers read a hand-written `.env` exactly as docker compose v2 does.

The collector's `parse_dotenv` and the converger's `parse_env` each run the table below, whose
expected values were captured from the real `docker compose config` (v2.40.3) into
tests/fixtures/dotenv/compose_reads.json; `test_the_capture_is_what_compose_reads_now` runs
compose again where it is installed, so the capture cannot rot. Capture again with
`.venv/bin/python -m tests.unit.test_dotenv_compose_parity` (it rewrites the fixture).

The converger's writes are held to compose too: each key of each line the table accepts,
replaced by `write_env` with values needing no quotes, single and double quotes, reads back
(in compose and in both readers) as the new value with every other key as it was, and a value
`quote` writes reads back unchanged.

Where compose computes a value from what a reader on the box cannot know (the directory it
runs in, a `${...}` form the readers do not model), the readers leave the key out: it reads as
absent, so a converge writes it plainly, never as a value compose does not hold. A file compose
refuses gives no entry to the collector and fails the converge, naming the line.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from reconciler.box_program import box_source
from reconciler.desired.types import check_env_value
from tests.unit.conftest import ROOT, load_box_program

collector = load_box_program(
    "box_collector_dotenv_parity", "reconciler/observe/remote/collector.py"
)
converge = load_box_program("box_converge_dotenv_parity", "reconciler/apply/remote/converge.py")
READERS = (collector, converge)
CAPTURE = ROOT / "tests" / "fixtures" / "dotenv" / "compose_reads.json"
HOME = "/home/compose-probe"  # HOME in the environment compose ran in for the capture
SCRUBBED_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
PWD = "<PWD>"  # the directory compose ran in, as the capture writes it
# How the reconciler runs compose on a box: `env -i PATH=... HOME=...` (converge.py `scrubbed`).
COMPOSE_ENV = {"PATH": SCRUBBED_PATH, "HOME": HOME}


# (id, .env text, keys to read, keys compose computes and the readers leave out by design)
Case = tuple[str, str, tuple[str, ...], tuple[str, ...]]
CASES: list[Case] = [
    # single quotes: literal, but `\'` is a quote and `\` before the closing `'` escapes it
    ("sq_escaped_quote", "V='a\\'b'\nW=2\n", ("V", "W"), ()),
    ("sq_backslashes", "V='a\\\\b\\x\\n'\n", ("V",), ()),
    ("sq_even_trailing_backslashes", "V='a\\\\'\nW=2\n", ("V", "W"), ()),
    ("sq_odd_trailing_backslash", "V='a\\'\nW=2\n", ("V", "W"), ()),
    ("sq_double_quote_inside", "V='a\"b' # c\n", ("V",), ()),
    # double quotes: Go escapes, an unknown one keeps its backslash
    ("dq_control_escapes", 'V="\\a\\b\\f\\v\\t\\n\\r"\n', ("V",), ()),
    ("dq_unknown_escapes", 'V="\\\'x\\x41\\u0041\\q\\c\\ "\n', ("V",), ()),
    ("dq_escaped_quote", 'V="a\\"b"\nW="a\\\\\\"b"\n', ("V", "W"), ()),
    ("dq_trailing_backslash", 'V="a\\\\"\nW=2\n', ("V", "W"), ()),
    ("dq_octal", 'V="\\0101|\\012|\\08|\\0|\\0777|\\0400|\\0377|\\0000"\n', ("V",), ()),
    ("dq_single_quote_inside", 'V="it\'s"\n', ("V",), ()),
    (
        "dq_lobes_serve_args",
        'SPEC="\'--speculative-config={\\"method\\": \\"dflash\\", \\"n\\": 12}\'"   # c\n',
        ("SPEC",),
        (),
    ),
    # export, spacing, empty values, a key alone, YAML style
    ("export", "export V=1\nexport\tW=2\n", ("V", "W"), ()),
    ("export_spacing", "export  V =  1 2  \n", ("V",), ()),
    ("export_glued", "exportV=1\nexport=2\n", ("exportV", "export", "V"), ()),
    ("export_twice", "export export V=1\n", ("V",), ()),
    ("export_alone", "export\nV=1\n", ("V", "export"), ()),
    ("spacing", "V = value\n  W=1\n\tX =\t2\n", ("V", "W", "X"), ()),
    ("yaml_colon", "V: 1\nW:a:b\nX=c:d\n", ("V", "W", "X"), ()),
    ("empty", "V=\nW=  \nX=", ("V", "W", "X"), ()),
    ("key_alone", "V\nPATH\nW=2\n", ("V", "PATH", "W"), ()),
    ("key_alone_last", "W=2\nV", ("V", "W"), ()),
    ("key_with_space", "A B=1\n", ("A", "B"), ()),
    ("key_with_tab", "A\tB=1\nW=2\n", ("A", "B", "W"), ()),
    ("key_other_names", "V.x=1\nV-y=2\nV[0]=3\n\u00e9=4\n1V=5\nW=6\n", ("V", "W"), ()),
    ("key_bad_character", "V/x=1\nW=2\n", ("V", "W"), ()),
    ("key_nbsp", "V\u00a0=1\n", ("V",), ()),
    # inline comments: ` #` (a space) on an unquoted value; anything after a closing quote
    ("comment_unquoted", "V=a # c\nW=a#b\nX=a\t#b\nY=#b\nZ= #b\n", ("V", "W", "X", "Y", "Z"), ()),
    ("comment_quoted", 'V="a" # c\nW=\'b\'# c\nX="c"\t#c\n', ("V", "W", "X"), ()),
    ("comment_lines", "# c\n  # d\nV=1 # x # y\n#W=2\n", ("V", "W"), ()),
    ("after_quote_statement", "V=\"a\" W=3\nX='b'\tY=c\n", ("V", "W", "X", "Y"), ()),
    ("after_quote_word", 'V="a" junk\nW=2\n', ("V", "W", "junk"), ()),
    ("after_quote_glued", 'V="a"junk=1\nW=2\n', ("V", "W", "junk"), ()),
    ("after_quote_quote", 'V="a" "b"\n', ("V",), ()),
    ("after_quote_control", 'V="a"\x1cW=2\n', ("V", "W"), ()),
    # values spanning lines
    ("dq_multiline", 'V="a\nb"\nW=2\n', ("V", "W"), ()),
    (
        "sq_multiline_spells_a_key",
        "V='a\nSPELLED_NAME=x'\nW=2\n",
        ("V", "SPELLED_NAME", "W"),
        (),
    ),
    ("multiline_then_more", 'V="a\n# no comment\nb" W="c\nd"\nX=2\n', ("V", "W", "X"), ()),
    ("unterminated", 'A=1\nV="abc\nW=2\n', ("A", "V", "W"), ()),
    ("backslash_newline", 'V=a\\\nb\nW="c\\\nd"\n', ("V", "b", "W"), ()),
    # line ends, a byte order mark, blanks
    ("crlf", "V=a\r\nW=\"b\"\r\nX='c' # d\r\nY=e # f\r\n", ("V", "W", "X", "Y"), ()),
    ("crlf_inside_quotes", 'V="a\r\nb"\r\nW=2\r\n', ("V", "W"), ()),
    ("byte_order_mark", "\ufeffV=1\nW=2\n", ("V", "W"), ()),
    ("lone_cr", "V=a\rW=1\n", ("V", "W"), ()),
    ("other_breaks", "V=a\x0bb\u2028c\x85d\x0ce\n", ("V",), ()),
    ("trailing_unicode_space", "V=a\u00a0\nW=a\u2003\nX=a\x1c\n", ("V", "W", "X"), ()),
    ("leading_unicode_space", "V=\u00a0a\nW=\u2003a\nX=\x0b'q'\n", ("V", "W", "X"), ()),
    ("blanks", "\n\n  \n\tV=1\n\n W = a b c  \t\n", ("V", "W"), ()),
    ("nul", "V=a\x00b\n", ("V",), ()),
    ("duplicate", "V=1\nV=2\nW='x'\nW=\n", ("V", "W"), ()),
    # interpolation: unquoted and double-quoted values, never single-quoted ones
    ("interp_quotes", "A=1\nV=$A/${A}\nW=\"$A/${A}\"\nX='$A/${A}'\n", ("V", "W", "X"), ()),
    ("interp_unset", "V=${UNSET}x\nW=$UNSET\n", ("V", "W"), ()),
    (
        "interp_operators",
        "A=\nB=1\nV=${A:-x}|${A-x}|${A:+p}|${A+p}|${U:+p}|${U+p}|${B:+p}|${U:-d}|${U-d}\n",
        ("V",),
        (),
    ),
    ("interp_environment", "V=$HOME/m\nW=${PATH}\nHOME=/x\nX=$HOME\n", ("V", "W", "X", "HOME"), ()),
    ("interp_itself", "V=$V\nW=1\nW=${W}2\n", ("V", "W"), ()),
    ("interp_dollar_literal", "V=a$\nW=a$-b\nX=$1\nY=$$x\nZ=$$$\n", ("V", "W", "X", "Y", "Z"), ()),
    ("interp_escaped", 'A=1\nV="\\$A"\nW="$$A"\nX="\\\\$A"\nY=\\$A\n', ("V", "W", "X", "Y"), ()),
    ("interp_case", "a_b=z\nV=${A_B}|${a_b}|$a_b\n", ("V",), ()),
    ("interp_required_set", "A=1\nV=${A:?must}\nB=\nW=${B?must}\n", ("V", "W"), ()),
    ("interp_required_empty", "B=\nV=${B:?must}\n", ("V",), ()),
    ("interp_required_unset", "V=${U?must}\n", ("V",), ()),
    ("interp_digit_name", "V=${1}\n", ("V",), ()),
    ("interp_bad_operator", "V=${A:x}\n", ("V",), ()),
    ("interp_unclosed", "V=${A\n", ("V",), ()),
    ("interp_empty_braces", "V=${}\n", ("V",), ()),
    ("interp_blank_in_braces", "V=${A B}\n", ("V",), ()),
    ("interp_colon_in_default", "V=${U:-http://x:1/a b}\nW=${U-a-b}\n", ("V", "W"), ()),
    ("interp_brace_after", "V=${U}}\nW=$U{x}\n", ("V", "W"), ()),
    ("interp_unbalanced", "V=${U:-'${A:-}B\n", ("V",), ()),
    ("interp_line_in_default", 'V="${A:-\nx}"\n', ("V",), ()),
    ("interp_unknown_then_failing", "V=${U:-?}${U:-${A}\n", ("V",), ()),
    ("export_last", "V=1\nexport ", ("V",), ()),
    # what the readers cannot know: the key reads as absent
    ("interp_pwd", "V=$PWD\nW=${V}x\nX=${V+set}\n", ("V", "W", "X"), ("V", "W")),
    ("interp_pwd_overrides", "V=1\nV=$PWD/m\n", ("V",), ("V",)),
    ("key_pwd", "PWD=x\nW=1\n", ("PWD", "W"), ("PWD",)),
    ("interp_nested", "V=${U:-${W:-z}}\n", ("V",), ("V",)),
    ("interp_ambiguous", "V=${U:-a?b}\nW=${U+a-b}\n", ("V", "W"), ("V", "W")),
    ("interp_escaped_nested", "V=${A:-{$${A}\n", ("V",), ("V",)),
    # lobes' rendered shape
    (
        "lobes_like",
        "PRIMARY_MAX_MODEL_LEN=131072   # the primary now serves...\n"
        'export MODEL_GEAR_VERSION=0.91.0\nHF_REVISION=\nQUOTED="keep me" # c\n'
        "GATEWAY_HOST='0.0.0.0'  # bind\n",
        ("PRIMARY_MAX_MODEL_LEN", "MODEL_GEAR_VERSION", "HF_REVISION", "QUOTED", "GATEWAY_HOST"),
        (),
    ),
]
CASE_BY_ID = {case[0]: case for case in CASES}
# Values a converge writes over each key: bare, bare where a comment follows ("" needs quotes
# there), single quotes, double quotes.
NEW_VALUES = ("new-1", "", "two words #x", 'it\'s \\ "q"')
QUOTE_VALUES = [
    "plain", "", "a b", "#x", " lead", "trail ", "$HOME", "${A}", "a\\b", "a\\\\", "it's",
    "it's \\\\", 'say "hi"', "\\'", "tab\there", "\u2028x", "x\x0b", "=", "a #b", "\\n",
    "'", '"', "\\", "\\\\", "a\\'b", "\u00e9\u00a0",
]  # fmt: skip


# Random `.env` texts (seeded: the same ones every run) of the pieces the table is made of; their
# capture found the cases after `interp_brace_after` above.
FUZZ_KEYS = ("A", "B", "V", "W")
_PIECES = [
    "A", "V", "=", "=", ":", "'", '"', "\\", "$", "{", "}", "#", " #", " ", "\t", "\n", "\n",
    "\r\n", "\r", "x", "1", "export ", "${A}", "$A", "${A:-", "-", "?", "+", "\\n", "\\'",
    '\\"', "\u00a0", ".",
]  # fmt: skip


def fuzz_texts(count: int = 150, seed: int = 20261206) -> list[str]:
    rng = random.Random(seed)
    texts = []
    for _ in range(count):
        lines = []
        for _ in range(rng.randint(1, 5)):
            quote = rng.choice(["", "", "'", '"'])
            body = "".join(rng.choice(_PIECES) for _ in range(rng.randint(0, 8)))
            lines.append(
                rng.choice(["A", "B", "V", "W", "export V", " V", "V "])
                + rng.choice(["=", "=", ": ", " = "])
                + quote
                + body
                + quote
                + rng.choice(["", "", " # c", "#c", " W=1", "\t#x"])
            )
        texts.append("\n".join(lines) + rng.choice(["", "\n"]))
    return texts


def compose_reads(text: str, keys: tuple[str, ...]) -> dict[str, Any]:
    """What the real `docker compose config` reads as each of `keys` from an `.env` holding
    `text`, run as the reconciler runs it on a box (`env -i PATH HOME`): {key: value or None
    (unset)}, or {"refused": compose's error without the directory}."""
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, ".env").write_bytes(text.encode("utf-8"))
        lines = ["services:", "  s:", "    image: alpine", "    environment:"]
        lines += [f"      {key}: ${{{key}-__UNSET__}}" for key in keys]
        Path(tmp, "compose.yaml").write_text("\n".join(lines) + "\n", encoding="utf-8")
        done = subprocess.run(
            ["docker", "compose", "--project-directory", tmp, "config", "--format", "json"],
            env={**COMPOSE_ENV},
            cwd=tmp,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if done.returncode:
            # its last line: the warnings before it carry the time
            return {"refused": done.stderr.strip().splitlines()[-1].replace(tmp, "<DIR>")}
        got = json.loads(done.stdout)["services"]["s"]["environment"]
    # `config` writes each `$` of a value as `$$`; the directory is this run's own.
    values = {key: got[key].replace("$$", "$").replace(tmp, PWD) for key in keys}
    return {key: None if value == "__UNSET__" else value for key, value in values.items()}


def _use_capture_home(module: ModuleType) -> dict[str, Any]:
    """The readers' view of compose's environment, with the capture's HOME."""
    env: dict[str, Any] = dict(module._compose_env())
    env["HOME"] = HOME
    return env


@pytest.fixture(autouse=True)
def _capture_home(monkeypatch: pytest.MonkeyPatch) -> None:
    for module in READERS:
        if hasattr(module, "_compose_env"):  # (a reader from before it had one reads no `$`)
            monkeypatch.setattr(module, "_COMPOSE_ENV", _use_capture_home(module))


def collector_reads(text: str) -> dict[str, str]:
    return {e["key"]: e["value"] for e in collector.parse_dotenv(text)}  # the last one wins


def converge_reads(text: str) -> dict[str, str]:
    return {key: value for key, (value, _) in converge.parse_env(text).items()}


def written(tmp_path: Path, text: str, key: str, value: str) -> str:
    """The `.env` a converge leaves after writing `key`'s desired `value` over `text`."""
    env = tmp_path / ".env"
    env.write_bytes(text.encode("utf-8"))
    env.chmod(0o600)
    box = converge.Box({"directory": str(tmp_path), "project": "lobes", "compose_files": []})
    converge.write_env(box, [key], {key: value})
    return env.read_bytes().decode("utf-8")


def replacements(case: Case) -> list[tuple[str, str]]:
    """(key, new value) for each key of the case a converge may write (not one compose's
    environment overrides): two of NEW_VALUES a key, in turn, so every kind meets every case."""
    turn = CASES.index(case)
    out = []
    for index, key in enumerate(k for k in case[2] if k not in ("PATH", "HOME", "PWD")):
        pair = NEW_VALUES[0::2] if (turn + index) % 2 else NEW_VALUES[1::2]
        out += [(key, new) for new in pair]
    return out


def capture(every: int = 1) -> dict[str, Any]:
    """The fixture: every case, every replacement and every quoted value as compose reads it
    (`every`: only each every-th replacement and fuzz text, for the live re-check)."""
    version = subprocess.run(
        ["docker", "compose", "version"], capture_output=True, text=True, check=True
    ).stdout.strip()
    with ThreadPoolExecutor(4) as pool:
        cases = dict(
            zip(CASE_BY_ID, pool.map(lambda c: compose_reads(c[1], c[2]), CASES), strict=True)
        )
        replaced: list[dict[str, Any]] = []
        with tempfile.TemporaryDirectory() as tmp:
            for case in CASES:
                if "refused" in cases[case[0]]:
                    continue
                for key, new in replacements(case):
                    text = written(Path(tmp), case[1], key, new)
                    replaced.append({"case": case[0], "key": key, "new": new, "text": text})
        replaced = replaced[::every]
        reads = pool.map(lambda r: compose_reads(r["text"], CASE_BY_ID[r["case"]][2]), replaced)
        for record, read in zip(replaced, reads, strict=True):
            record["read"] = read
        quoted: list[dict[str, Any]] = [
            {"value": v, "line": f"V={converge.quote(v)}\n"} for v in QUOTE_VALUES
        ]
        reads = pool.map(lambda q: compose_reads(q["line"], ("V",)), quoted)
        for record, read in zip(quoted, reads, strict=True):
            record["read"] = read.get("V")  # None: compose refuses the line
        texts = fuzz_texts()[::every]
        fuzz = [
            {"text": text, **read}
            for text, read in zip(
                texts, pool.map(lambda t: compose_reads(t, FUZZ_KEYS), texts), strict=True
            )
        ]
    return {"compose": version, "home": HOME, "cases": {
        case_id: {"text": CASE_BY_ID[case_id][1], **read} for case_id, read in cases.items()
    }, "replaced": replaced, "quoted": quoted, "fuzz": fuzz}  # fmt: skip


@pytest.fixture(scope="module")
def captured() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(CAPTURE.read_text(encoding="utf-8"))
    return data


# -- the readers read each case as compose did ---------------------------------------------------
@pytest.mark.parametrize("case", CASES, ids=[case[0] for case in CASES])
def test_each_reader_reads_the_case_as_compose_does(case: Case, captured: dict[str, Any]) -> None:
    case_id, text, keys, unknown = case
    read = dict(captured["cases"][case_id])
    assert read.pop("text") == text  # the table and the capture are of one text
    if "refused" in read:
        problems: list[Any] = []
        assert collector.parse_dotenv(text, problems) == []
        assert len(problems) == 1 and isinstance(problems[0][0], int)
        with pytest.raises(converge.Failed, match=r"^\.env line \d+: docker compose refuses"):
            converge.parse_env(text)
        return
    want = {key: value for key, value in read.items() if value is not None}
    for key in unknown:  # compose computes it from what the box cannot know: absent here
        assert want.pop(key) is not None
    for got in (collector_reads(text), converge_reads(text)):
        assert {key: got[key] for key in keys if key in got} == want


@pytest.mark.parametrize("case", CASES, ids=[case[0] for case in CASES])
def test_each_key_is_found_at_its_line(case: Case, captured: dict[str, Any]) -> None:
    """The collector's `line` is the physical line the key is on; the converger's index is the
    line of env_lines holding it, a quoted value spanning lines kept in one; env_lines keeps
    every byte."""
    _, text, _, _ = case
    assert "".join(converge.env_lines(text, keepends=True)) == text
    ending = "\n" if text.endswith("\n") else ""
    assert "\n".join(collector.env_lines(text)) + ending == text
    if "refused" in captured["cases"][case[0]]:
        return
    physical = text.split("\n")
    for entry in collector.parse_dotenv(text):
        assert entry["key"] in physical[entry["line"] - 1]
    lines = converge.env_lines(text)
    for key, (_, index) in converge.parse_env(text).items():
        assert key in lines[index]


def test_random_texts_read_as_compose_read_them(captured: dict[str, Any]) -> None:
    """Never a value compose does not hold, never a key it does not set, a refusal where it
    refuses; a key is left out only where a `${...}` the readers do not model computes it."""
    assert [record["text"] for record in captured["fuzz"]] == fuzz_texts()
    for record in captured["fuzz"]:
        read = dict(record)
        text = read.pop("text")
        if "refused" in read:
            assert collector.parse_dotenv(text) == [], text
            with pytest.raises(converge.Failed):
                converge.parse_env(text)
            continue
        for got in (collector_reads(text), converge_reads(text)):
            for key in FUZZ_KEYS:
                if key in got:
                    assert got[key] == read[key], (text, key)
                else:
                    assert read[key] is None or "${" in text, (text, key)


# -- a converge's writes read back in compose and in both readers --------------------------------
@pytest.mark.parametrize("case", CASES, ids=[case[0] for case in CASES])
def test_a_written_key_reads_back_new_and_the_others_as_they_were(
    case: Case, captured: dict[str, Any], tmp_path: Path
) -> None:
    case_id, text, keys, _ = case
    before = captured["cases"][case_id]
    if "refused" in before:
        env = tmp_path / ".env"
        env.write_bytes(text.encode("utf-8"))
        box = converge.Box({"directory": str(tmp_path), "project": "lobes", "compose_files": []})
        with pytest.raises(converge.Failed, match=r"^\.env line \d+: docker compose refuses"):
            converge.write_env(box, ["V"], {"V": "new"})
        assert env.read_bytes() == text.encode("utf-8")  # nothing touched
        return
    records = [r for r in captured["replaced"] if r["case"] == case_id]
    assert [(r["key"], r["new"]) for r in records] == replacements(case)
    for record in records:
        key, new = record["key"], record["new"]
        assert written(tmp_path, text, key, new) == record["text"], (key, new)
        after = record["read"]  # compose's reading of that text
        assert after[key] == new, (key, new)
        for other in keys:  # unchanged, but where its value interpolates the written key
            if other != key and "$" + key not in text and "${" + key not in text:
                assert after[other] == before[other], (key, new, other)
        for got in (collector_reads(record["text"]), converge_reads(record["text"])):
            assert got[key] == new, (key, new)
            for k in keys:  # as compose reads it, or left out where the case says it may be
                assert got[k] == after[k] if k in got else after[k] is None or k in case[3]


def test_each_quoted_value_reads_back_in_compose_and_in_both_readers(
    captured: dict[str, Any],
) -> None:
    """Each value `quote` writes reads back unchanged in compose and in both readers, but one
    the loader refuses for it (an odd run of backslashes ending a value without `'`: `'\\'`
    never ends)."""
    assert [record["value"] for record in captured["quoted"]] == QUOTE_VALUES
    for record in captured["quoted"]:
        value = record["value"]
        assert f"V={converge.quote(value)}\n" == record["line"]
        if record["read"] != value:
            assert not accepted(value)
            assert collector.parse_dotenv(record["line"]) == []  # compose refused it too
            continue
        assert collector_reads(record["line"]) == converge_reads(record["line"]) == {"V": value}


def accepted(value: str) -> bool:
    try:
        check_env_value(value)
    except ValueError:
        return False
    return True


@settings(max_examples=400, deadline=None)
@given(st.text(st.characters(codec="utf-8"), max_size=24), st.booleans())
def test_any_value_the_loader_takes_reads_back_as_written(value: str, commented: bool) -> None:
    """Whatever the desired state lets reach `.env`, written bare, quoted or over a line with
    an inline comment, both readers read back unchanged."""
    assume(accepted(value))
    line = f"A=1\nK={converge.quote(value)}\nB=2\n"
    assert collector_reads(line) == converge_reads(line) == {"A": "1", "K": value, "B": "2"}
    old = "K='old' W=3 # why\n" if commented else "K=old   # why\n"
    new = converge.replace_value(old.rstrip("\n"), "K", value) + "\n"
    want = {"K": value, "W": "3"} if commented else {"K": value}
    assert collector_reads(new) == converge_reads(new) == want
    assert new.endswith("# why\n")


# -- the capture is what compose reads today ------------------------------------------------------
# No skip when compose is missing: scripts/setup.sh installs it, and a capture nobody can
# re-check is a capture that may have rotted.
def test_the_capture_is_what_compose_reads_now(captured: dict[str, Any]) -> None:
    """Every case and quoted value, and every 8th write and fuzz text (a compose that reads
    differently changes many of them; the whole capture took ~530 compose runs, ~30 s)."""
    now = capture(every=8)
    assert now["cases"] == captured["cases"]
    assert now["replaced"] == captured["replaced"][::8]
    assert now["quoted"] == captured["quoted"]
    assert now["fuzz"] == captured["fuzz"][::8]


if __name__ == "__main__":
    for module in READERS:
        setattr(module, "_COMPOSE_ENV", _use_capture_home(module))  # noqa: B010
    CAPTURE.parent.mkdir(parents=True, exist_ok=True)
    data = capture()
    CAPTURE.write_text(json.dumps(data, indent=1, ensure_ascii=True) + "\n", encoding="utf-8")
    print(f"{CAPTURE}: {len(data['cases'])} cases, {len(data['replaced'])} writes", file=sys.stderr)
    sys.exit(os.EX_OK)


# The collector and the converge are each shipped to a box alone (stdlib only, one text each),
# and both read `.env` with compose's reader: one module, reconciler/box_shared/dotenv.py,
# packed into each program's text (reconciler/box_program.py).
def test_both_box_programs_run_the_one_shared_reader() -> None:
    shared = (ROOT / "reconciler" / "box_shared" / "dotenv.py").read_text(encoding="utf-8")
    for relative in (
        "reconciler/observe/remote/collector.py",
        "reconciler/apply/remote/converge.py",
    ):
        assert box_source(ROOT / relative).count(shared) == 1, relative
        own = (ROOT / relative).read_text(encoding="utf-8")
        assert "def _dotenv_read(" not in own, f"{relative} carries a reader of its own again"
    for name in ("_dotenv_read", "_dotenv_lines", "_secret_file_values", "_removal"):
        assert getattr(collector, name).__code__.co_code == getattr(converge, name).__code__.co_code


@pytest.mark.parametrize(
    ("text", "key", "expected"),
    [
        # the first statement of a line goes, the second stays (the whole line went before)
        ('V="a" W=3\n', "V", " W=3\n"),
        # the second goes, the first stays (it was not found before: the key stayed)
        ('V="a" W=3\n', "W", 'V="a" \n'),
        # every assignment of the key, so that no earlier one becomes the value
        ("K=1\nX=2\nK=3 # why\n", "K", "X=2\n"),
        # a value across lines goes whole
        ('M="x\ny"\nK=1\n', "M", "K=1\n"),
        # a commented-out assignment is no statement: it stays
        ("#K=1\nK=2\n", "K", "#K=1\n"),
    ],
)
def test_a_key_managed_as_absent_is_removed_statement_by_statement(
    tmp_path: Path, text: str, key: str, expected: str
) -> None:
    """`env: {KEY: null}`: the converge removes the key's statements and keeps every other
    statement on their lines, as the collector's render of that converge predicts."""
    env = tmp_path / ".env"
    env.write_bytes(text.encode("utf-8"))
    env.chmod(0o600)
    box = converge.Box({"directory": str(tmp_path), "project": "lobes", "compose_files": []})
    converge.write_env(box, [key], {key: None})
    after = env.read_text(encoding="utf-8")
    assert after == expected
    before = {e["key"]: e["value"] for e in collector.parse_dotenv(text) if e["key"] != key}
    assert {e["key"]: e["value"] for e in collector.parse_dotenv(after)} == before
