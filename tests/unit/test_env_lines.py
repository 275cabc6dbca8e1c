"""Both box programs split a `.env` as compose's dotenv does: at LF only.

str.splitlines() also breaks at VT, FF, FS/GS/RS, NEL, U+2028 and U+2029, which compose keeps
inside a value: a value holding one read as two lines on the box, so a line the value spelled
(`x<U+2028>GATEWAY_API_KEY=`) was an entry of its own to the collector, and the converger
appended its managed key again on every run.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.unit.conftest import load_box_program

collector = load_box_program("box_collector_env_lines", "reconciler/observe/remote/collector.py")
converge = load_box_program("box_converge_env_lines", "reconciler/apply/remote/converge.py")

BREAKS = ["\r", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029"]


@pytest.mark.parametrize("brk", BREAKS, ids=[f"U+{ord(b):04X}" for b in BREAKS])
def test_a_line_break_other_than_lf_stays_inside_its_value(brk: str) -> None:
    text = f"FOO_MODE='x{brk}GATEWAY_API_KEY=stolen'\nB=1\n"
    entries = collector.parse_dotenv(text)
    assert [(e["key"], e["line"]) for e in entries] == [("FOO_MODE", 1), ("B", 2)]
    assert entries[0]["value"] == f"x{brk}GATEWAY_API_KEY=stolen"
    # The converger reads the same entries, at the same lines (its index counts from 0).
    assert {k: (v, i + 1) for k, (v, i) in converge.parse_env(text).items()} == {
        e["key"]: (e["value"], e["line"]) for e in entries
    }


@pytest.mark.parametrize("brk", BREAKS, ids=[f"U+{ord(b):04X}" for b in BREAKS])
def test_the_collector_reads_a_box_file_as_the_converger_does(brk: str, tmp_path: Path) -> None:
    """Through the collector's one reader (read_text_file), CRLF endings included: the
    entries, values and lines the converger reads from the same bytes."""
    data = f"FOO_MODE=x{brk}GATEWAY_API_KEY=stolen\r\nB='2'\r\n".encode()
    (tmp_path / ".env").write_bytes(data)
    entries = collector.parse_dotenv(collector.read_text_file(str(tmp_path / ".env")))
    assert [(e["key"], e["value"], e["line"]) for e in entries] == [
        ("FOO_MODE", f"x{brk}GATEWAY_API_KEY=stolen", 1),
        ("B", "2", 2),
    ]
    assert {k: (v, i + 1) for k, (v, i) in converge.parse_env(data.decode()).items()} == {
        e["key"]: (e["value"], e["line"]) for e in entries
    }


def test_the_collectors_render_of_env_keeps_such_a_line_whole() -> None:
    """The `.env` the collector renders as a converge would write it (desired_envfile): the
    box's line with U+2028 in its value is one line, kept; the managed key is written once."""
    brk = "\u2028"
    current = f"FOO_MODE='x{brk}GATEWAY_API_KEY='\nGATEWAY_API_KEY=old\n"

    run = SimpleNamespace(p={"managed_env": {"GATEWAY_API_KEY": "new"}})
    written = collector.desired_envfile(run, current, {})
    assert written == f"FOO_MODE='x{brk}GATEWAY_API_KEY='\nGATEWAY_API_KEY=new\n"
    assert collector.env_lines("") == [] and collector.env_lines("A=1") == ["A=1"]
    assert collector.env_lines("A=1\n\nB=2\n") == ["A=1", "", "B=2"]
