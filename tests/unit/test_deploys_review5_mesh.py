"""Review 5: deploys/mesh.py's verify after a box's converge failed.

The verify was one operation, on the last box of the run; pyinfra runs nothing more on a host
once an operation failed on it, so when that box's converge failed, the boxes before it went
unverified and nothing said so. Every box of the run has the verify now and, when it runs,
the last box still active does the check; when every box failed, the run says so.

The fleet is the lab-incidents example, through the pyinfra wrapper of test_deploys_review_fixes
(real pyinfra, faked boxes), its converge failing for the boxes named in $FAKE_FAIL and its
verify finding $FAKE_LEFT left when set.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.unit.test_deploys_review_fixes import (
    EXAMPLE,
    FAKE_PYINFRA,
    ROOT,
    fake_lines,
    pyinfra,
    said,
)

_CONVERGE = """\
def execute(prep, who, on_event=None):
    print(f"[converge {prep.box}]", file=sys.stderr)
    return E.Outcome(prep.box, ok=True, changed=True, plan=prep.plan, started_at="t")
"""
_FAILING = """\
def execute(prep, who, on_event=None):
    print(f"[converge {prep.box}]", file=sys.stderr)
    ok = prep.box not in os.environ.get("FAKE_FAIL", "").split(",")
    return E.Outcome(prep.box, ok=ok, changed=True, plan=prep.plan, started_at="t",
                     failed=None if ok else "verification failed")
"""
_SETTLE = "    return None, []\n"
_LEFT = '    return None, [os.environ["FAKE_LEFT"]] if os.environ.get("FAKE_LEFT") else []\n'


@pytest.fixture(scope="module")
def fleet_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("mesh")
    repo = base / "fleet"
    shutil.copytree(EXAMPLE, repo)
    shutil.copy(ROOT / "inventory.py", repo / "inventory.py")
    for part in ("deploys", "roles"):
        shutil.copytree(ROOT / part, repo / part, ignore=shutil.ignore_patterns("__pycache__"))
    assert FAKE_PYINFRA.count(_CONVERGE) == 1 and FAKE_PYINFRA.count(_SETTLE) == 1
    fake = FAKE_PYINFRA.replace(_CONVERGE, _FAILING).replace(_SETTLE, _LEFT)
    (base / "fake_pyinfra.py").write_text(fake)
    return repo


def _run(repo: Path, *flags: str, fail: str = "", left: str = "") -> tuple[int, str, list[str]]:
    done = pyinfra(
        repo, "-y", *flags, "inventory.py", "deploys/mesh.py", FAKE_FAIL=fail, FAKE_LEFT=left
    )
    acted = [line for line in fake_lines(done) if not line.startswith("[observe")]
    return done.returncode, said(done), acted


@pytest.mark.parametrize(
    ("limit", "fail", "checked"),
    [
        ([], "orin", ["thor", "spark"]),  # the reviewer's repro: the last box in mesh order
        ([], "spark,orin", ["thor"]),
        ([], "", ["thor", "spark", "orin"]),  # none failed: still one check, not one per box
        (["thor", "spark"], "spark", ["thor"]),  # the last box of a --limit run
    ],
)
def test_the_mesh_is_verified_once_from_the_last_box_still_active(
    fleet_repo: Path, limit: list[str], fail: str, checked: list[str]
) -> None:
    flags = [arg for box in limit for arg in ("--limit", box)]
    code, text, acted = _run(fleet_repo, *flags, fail=fail)
    assert code == (1 if fail else 0), text
    assert "Traceback" not in text
    run = limit or ["thor", "spark", "orin"]  # mesh order of lab-incidents
    assert acted == [*(f"[converge {b}]" for b in run), f"[verify {','.join(checked)}]"], text
    assert f"mesh: no drift left on {', '.join(checked)}" in text.splitlines()
    assert "not verified" not in text


def test_when_every_box_failed_the_run_says_the_mesh_is_not_verified(fleet_repo: Path) -> None:
    code, text, acted = _run(fleet_repo, fail="thor,spark,orin")
    assert code == 1, text
    assert acted == ["[converge thor]", "[converge spark]", "[converge orin]"], text
    said_mesh = [line for line in text.splitlines() if line.startswith("mesh: ")]
    assert said_mesh == ["mesh: not verified: every box of this run failed (thor, spark, orin)"]


def test_a_verify_that_finds_drift_on_the_one_box_left_is_not_every_box_failed(
    fleet_repo: Path,
) -> None:
    """thor and spark failed, orin converged and its check finds drift left: the run says the
    drift, not that every box failed (the check's own failure is no converge's)."""
    code, text, acted = _run(fleet_repo, fail="thor,spark", left="orin: gateway still restarting")
    assert code == 1, text
    assert acted[-1] == "[verify orin]", text
    said_mesh = [line for line in text.splitlines() if line.startswith("mesh: ")]
    assert said_mesh == ["mesh: orin: gateway still restarting"], text
