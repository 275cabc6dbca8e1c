"""A snapshot replay imports only what it uses: `reconcile diff`'s comparison, the history's
record and the desired state's problem types (with dataclasses) are not on its path, ~25 ms
of every small replay's imports."""

from __future__ import annotations

from pathlib import Path

from bench import scale_fleet
from tests.unit.conftest import fresh_python

ROOT = Path(__file__).resolve().parents[2]
UNUSED = ("reconciler.history.diff", "reconciler.history.record", "reconciler.desired.problems")


def _replay_modules(root: Path, out: Path, cache: Path) -> list[str]:
    """A replay's exit code, then those of UNUSED and dataclasses it imported."""
    argv = ["--root", str(root), "-i", "lab", "drift", "--from-snapshot", str(root / "snapshot")]
    argv += ["--format", "json", "--output", str(out)]
    code = (
        "import os, sys\n"
        f"sys.path.insert(0, {str(ROOT)!r})\n"
        "from reconciler.cli import main\n"
        f"code = main({argv!r})\n"
        f"wanted = {(*UNUSED, 'dataclasses')!r}\n"
        "print(code, sorted(m for m in wanted if m in sys.modules))\n"
        "sys.stdout.flush()\n"
        "os._exit(0)\n"
    )
    return fresh_python(code, cache).strip().split(maxsplit=1)


def test_a_replay_imports_neither_the_diff_nor_the_problem_types(tmp_path: Path) -> None:
    root, out, cache = tmp_path / "fleet", tmp_path / "report.json", tmp_path / "cache"
    scale_fleet.build_fleet(root, 3)
    first = _replay_modules(root, out, cache)  # loads the YAML (pydantic, dataclasses)
    assert first[0] == "2", first  # the replay ran and found the incidents' drift
    assert not any(m in first[1] for m in UNUSED[:2]), first
    again = _replay_modules(root, out, cache)  # the drift inputs remembered
    assert again == ["2", "[]"]
    assert out.stat().st_size > 0
