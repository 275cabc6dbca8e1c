"""A login shell whose trace failed (a profile that exec'd another shell, a timeout) is not a
shell that exports nothing: the keys table says `not traced`, and a key neither `.env` nor a
traced shell gives is said to be perhaps the shell's, not simply stale. On the captured
incident (a key armed from the login shell), with that box's trace made to fail."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from reconciler.audit.report_md import render_markdown
from reconciler.audit.report_text import render_text
from tests.unit.test_audit_review_fixes import judge, on, snapshot
from tests.unit.test_audit_snapshots import fleet

NEVER_RAN = "the login shell never ran the traced command (it exec'd another program or exited)"


def _untraced(doc: dict[str, Any]) -> None:
    doc["collected"]["login_shell"] = {"error": NEVER_RAN}


def test_an_untraced_login_shell_is_said_so_not_taken_for_none(tmp_path: Path) -> None:
    traced = snapshot(tmp_path / "a", "key_armed_from_login_shell", on("thor", lambda d: None))
    untraced = snapshot(tmp_path / "b", "key_armed_from_login_shell", on("thor", _untraced))
    before, _ = judge(traced, fleet({"thor": "open"}))
    after, _ = judge(untraced, fleet({"thor": "open"}))
    assert "not traced" not in render_text(before, width=200)
    text, markdown = render_text(after, width=200), render_markdown(after)
    assert "not traced" in text and "not traced" in markdown
    assert "shell not traced" in text  # what the gateway runs with: not .env's, maybe the shell's
    (stale,) = [f for f in after.verdict_of("thor").findings if f.code == "key.stale"]
    assert "the login shell was not traced: it may give it" in stale.message
