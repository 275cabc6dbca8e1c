"""`reconcile` builds only the chosen command's parser (cli.command_named): every command line
must parse exactly as the whole parser parses it, and anything that is not plainly one command
(help, --version, a typo) gets the whole parser."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from reconciler import cli
from tests.unit.conftest import fresh_python

# Command lines as operators and the docs write them, with the top-level options in every
# spelling argparse takes (a long option by a prefix, a value in the same word, a value that
# is itself a command's name).
LINES = [
    ["drift"],
    ["drift", "--format", "json", "thor", "spark"],
    ["-i", "lab", "drift", "--format", "json"],
    ["--inventory=lab", "drift", "-o", "report.md", "--format", "markdown"],
    ["-ilab", "drift", "--max-parallel", "5", "--timeout", "12"],
    ["--inv", "lab", "drift", "--no-history"],
    ["--root", "drift", "audit", "--format", "json"],
    ["--ro", "/srv/fleet", "-i", "audit", "validate"],
    ["show", "--format", "json"],
    ["schema", "--report"],
    ["history", "--format", "json", "thor"],
    ["diff", "--from-snapshot", "a", "b"],
    ["apply", "thor", "--yes"],
    ["rollback", "thor"],
    ["snapshots", "thor"],
    ["import", "--output", "/tmp/new", "--force"],
    ["lab", "status"],
    ["audit", "--from-snapshot", "snap"],
    ["validate"],
    ["-i=lab", "--root=/srv/fleet", "drift"],
]


def _parsed(parser: argparse.ArgumentParser, argv: list[str]) -> dict[str, Any]:
    args = vars(parser.parse_args(argv))
    handler = args.pop("handler", None)
    # apply's handlers are closures made per build: compared by the function they wrap
    args["handler"] = getattr(handler, "__qualname__", handler)
    return args


@pytest.mark.parametrize("argv", LINES, ids=" ".join)
def test_a_command_line_parses_as_the_whole_parser_parses_it(argv: list[str]) -> None:
    command = cli.command_named(argv)
    full = cli.build_parser()
    assert command == _parsed(full, argv)["command"]
    assert _parsed(cli.build_parser(command), argv) == _parsed(full, argv)


def test_every_command_of_the_whole_parser_is_known_by_name() -> None:
    sub = next(a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    named = {name for names, _ in cli._COMMANDS for name in names}
    assert set(sub.choices) == named
    for names, _ in cli._COMMANDS:
        for name in names:  # each registrar adds the commands it is listed with
            only = cli.build_parser(name)
            chosen = next(a for a in only._actions if isinstance(a, argparse._SubParsersAction))
            assert set(chosen.choices) == set(names)


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["--help"],
        ["-h"],
        ["--version"],
        ["dirft"],
        ["-i"],
        ["--bogus", "drift"],
        ["--", "drift"],
    ],
    ids=repr,
)
def test_what_is_not_plainly_one_command_gets_the_whole_parser(argv: list[str]) -> None:
    assert cli.command_named(argv) is None


def test_an_option_value_that_names_a_command_is_not_taken_for_it() -> None:
    assert cli.command_named(["-i", "lab", "drift"]) == "drift"  # `lab` is a command too
    assert cli.command_named(["--root", "show", "drift"]) == "drift"


def test_a_drift_run_builds_no_other_commands_parser() -> None:
    """The point of it: `reconcile drift` imports none of the other commands' modules."""
    code = (
        "import sys\n"
        "from reconciler import cli\n"
        "cli.build_parser(cli.command_named(['drift', '--format', 'json']))\n"
        "print(sorted(m for m in ('reconciler.audit.cli', 'reconciler.apply.cli',"
        " 'reconciler.history.cli') if m in sys.modules))\n"
    )
    assert fresh_python(code).strip() == "[]"


def test_a_run_that_ends_well_imports_no_error_types_or_secrets_module() -> None:
    """The drift path's modules (the run key, the run id, the report's guard key come from
    os.urandom) and cli's error handling (its problem types are imported on an error only)."""
    code = (
        "import sys\n"
        "from reconciler import cli\n"
        "import reconciler.observe.early, reconciler.observe.payload, reconciler.drift\n"
        "import reconciler.report.values\n"
        "from reconciler.observe.payload import new_run_key\n"
        "assert len(new_run_key()) == 32 and new_run_key() != new_run_key()\n"
        "print(sorted(m for m in ('secrets', 'random', 'reconciler.desired.problems')"
        " if m in sys.modules))\n"
    )
    assert fresh_python(code).strip() == "[]"


def test_an_invalid_state_or_a_missing_controller_secret_is_exit_1(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from reconciler.desired.problems import DesiredStateError
    from reconciler.observe.controller_secrets import MissingControllerSecret

    def raises(exc: Exception) -> argparse.Namespace:
        def handler(_args: argparse.Namespace) -> int:
            raise exc

        return argparse.Namespace(handler=handler)

    assert cli._run(raises(DesiredStateError([]))) == cli.EXIT_ERROR
    assert "invalid desired state: 0 problems" in capsys.readouterr().err
    missing = MissingControllerSecret({("FLEET_GATEWAY_KEY", "gateway_key"): ["thor"]})
    assert cli._run(raises(missing)) == cli.EXIT_ERROR
    assert "error: secret gateway_key: $FLEET_GATEWAY_KEY is not set" in capsys.readouterr().err
    with pytest.raises(LookupError):
        cli._run(raises(LookupError("anything else is raised on")))
