"""What a repeated drift imports before its collectors are spawned: the command line, the
remembered inputs and the launch, and nothing that can wait until the boxes are working
(dataclasses and inspect under it: ~16 ms; the comparison's types; concurrent.futures)."""

from __future__ import annotations

from pathlib import Path

from reconciler.desired.load import load_fleet
from reconciler.drift_inputs import remembered_inputs
from tests.unit.conftest import fresh_python, hosts_inventory

WAITS = ("dataclasses", "inspect", "reconciler.compare.context", "concurrent.futures")


def test_the_launch_path_imports_nothing_that_can_wait(repo: Path, tmp_path: Path) -> None:
    remembered_inputs(load_fleet(repo, "hosts"), hosts_inventory(repo))
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from reconciler import cli\n"
        "args = cli.build_parser(cli.command_named(['drift'])).parse_args(['drift'])\n"
        "import reconciler.observe.early, reconciler.observe.payload, reconciler.history.hooks\n"
        "import reconciler.desired.locate, reconciler.observe.own_render\n"
        "from reconciler.drift_inputs import cached_inputs\n"
        f"inputs = cached_inputs(Path({str(repo)!r}), Path({str(hosts_inventory(repo))!r}))\n"
        "assert inputs is not None and inputs.targets['thor'].box == 'thor'\n"
        "hooks = reconciler.history.hooks\n"
        "outs = hooks.RunOutputs(None, None)\n"
        "assert outs.started > 0 and outs.clock > 0\n"
        f"print(sorted(m for m in {WAITS!r} if m in sys.modules))\n"
    )
    assert fresh_python(code, tmp_path / "cache").strip() == "[]"
