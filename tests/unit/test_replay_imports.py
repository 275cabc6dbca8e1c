"""A snapshot replay imports only what it uses: `reconcile diff`'s comparison and the history's
record are not on its path (~20 ms of every replay with what they import)."""

from __future__ import annotations

from pathlib import Path

from tests.unit.conftest import fresh_python

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "lab-incidents"


def test_a_replay_imports_neither_the_diff_nor_the_history_record(tmp_path: Path) -> None:
    argv = ["--root", str(EXAMPLE), "-i", "lab", "drift", "--from-snapshot"]
    argv += [str(EXAMPLE / "snapshot"), "--format", "json", "--output", str(tmp_path / "r.json")]
    code = (
        "import os, sys\n"
        f"sys.path.insert(0, {str(ROOT)!r})\n"
        "from reconciler.cli import main\n"
        f"code = main({argv!r})\n"
        "wanted = ('reconciler.history.diff', 'reconciler.history.record')\n"
        "print(code, sorted(m for m in wanted if m in sys.modules))\n"
        "sys.stdout.flush()\n"
        "os._exit(0)\n"
    )
    out = fresh_python(code, tmp_path / "cache").split()
    assert out[0] == "2", out  # the replay ran and found the incidents' drift
    assert out[1:] == ["[]"]
    assert (tmp_path / "r.json").stat().st_size > 0
