"""The history store masks a value assigned to a secret name inside a command word
(`HF_TOKEN=x`, `bash -c 'export GATEWAY_API_KEY=x; ...'`), as the reports' guard does: the
collector now hashes such values on the box, but an older or edited snapshot holds them in
clear, and a recorded replay of it stored them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from reconciler.history import masking
from tests.unit.test_fleet_secret_patterns import _replay, _stored_hits

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "lab-incidents"
WORDS = ["bash", "-c", "export GATEWAY_API_KEY=gw-clearvalue-44; exec vllm", "HF_TOKEN=hf_x9"]


def test_a_stored_command_word_keeps_no_assigned_secret() -> None:
    doc = {"collected": {"docker": {"containers": [{"cmd": list(WORDS), "env": {}}]}}}
    stored = masking.stored(doc)
    text = json.dumps(stored)
    assert "clearvalue" not in text and "hf_x9" not in text
    cmd = stored["collected"]["docker"]["containers"][0]["cmd"]
    assert cmd[2] == "export GATEWAY_API_KEY=***; exec vllm" and cmd[3] == "HF_TOKEN=***"
    assert cmd[:2] == ["bash", "-c"]


def test_a_command_line_with_no_assignment_is_kept_as_the_same_object() -> None:
    words = ["vllm", "serve", "--port=8000", "MODE=fast"]
    assert masking.argv(words) is words


def test_a_recorded_replay_stores_no_secret_assigned_in_a_word(tmp_path: Path) -> None:
    root = tmp_path / "fleet"
    shutil.copytree(EXAMPLE, root)
    box = root / "snapshot" / "thor.json"
    doc = json.loads(box.read_text("utf-8"))
    doc["collected"]["docker"]["containers"][0]["cmd"] = ["HF_TOKEN=org-clearvalue-9876"]
    box.write_text(json.dumps(doc), "utf-8")
    db = tmp_path / "history.sqlite3"
    out = _replay(root, "--format", "json", "--history", str(db))
    assert out.returncode == 2, out.stderr
    assert db.exists() and _stored_hits(db) == 0
