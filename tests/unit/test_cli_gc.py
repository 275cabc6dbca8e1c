"""The cyclic garbage collector in `reconcile` (cli.main): off for a live drift, on while the
desired state loads and for every other command, and as it was for an in-process caller."""

from __future__ import annotations

import gc
import shutil
from pathlib import Path
from typing import Any

import pytest

from reconciler import cli
from tests.unit.conftest import fresh_python

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "fleet"


class Stop(ValueError):
    """Ends the drift before any box is contacted (the CLI reports a ValueError, exit 1)."""


@pytest.fixture
def fleet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # nothing remembered
    root = tmp_path / "fleet"
    shutil.copytree(FIXTURE, root)
    return root


def test_a_live_drift_runs_without_it_and_loads_the_state_with_it(fleet, monkeypatch) -> None:
    seen: dict[str, bool] = {}
    import reconciler.desired.cache as cache
    import reconciler.drift as drift

    real_load = cache.load_fleet_cached

    def load(*args: Any, **kwargs: Any) -> Any:
        seen["loading the desired state"] = gc.isenabled()
        return real_load(*args, **kwargs)

    def run(*args: Any, **kwargs: Any) -> Any:
        seen["observing and comparing"] = gc.isenabled()
        raise Stop("stopped by the test")

    class NotStarted:
        def cancel(self) -> None:
            pass

    monkeypatch.setattr(cache, "load_fleet_cached", load)
    monkeypatch.setattr(drift, "run_drift_on", run)
    monkeypatch.setattr(cli, "_launch", lambda inputs, boxes: NotStarted())  # no SSH here
    assert gc.isenabled()
    code = cli.main(["--root", str(fleet), "-i", "hosts", "drift", "--no-history"])
    assert code == 1  # the test's Stop, reported as the run's error
    assert seen == {"loading the desired state": True, "observing and comparing": False}
    assert gc.isenabled()  # an in-process caller gets it back as it was


def test_other_commands_run_with_it(fleet, monkeypatch) -> None:
    seen = []
    monkeypatch.setattr(cli, "_cmd_validate", lambda args: seen.append(gc.isenabled()) or 0)
    # build_parser binds handlers when called: the patched one is the one that runs
    assert cli.main(["--root", str(fleet), "validate"]) == 0
    assert seen == [True]


def test_a_caller_that_turned_it_off_keeps_it_off(fleet) -> None:
    gc.disable()
    try:
        assert cli.main(["--root", str(fleet), "validate"]) == 0
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_run_as_the_program_it_leaves_nothing_for_the_exit_collection(fleet) -> None:
    code = (
        "import gc, sys\n"
        "from reconciler.cli import main\n"
        f"sys.argv = ['reconcile', '--root', {str(fleet)!r}, 'validate']\n"
        "code = main()\n"
        "print(code, gc.get_freeze_count() > 10000)\n"
    )
    assert fresh_python(code).splitlines()[-1].split() == ["0", "True"]
