"""The fan-out's command-line options (`--max-parallel`, `--timeout`), one place for every
observing command that takes them."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from reconciler.observe.fanout import (
    DEFAULT_TIMEOUT_S,
    LIMIT_ENV,
    TIMEOUT_ENV,
    default_limit,
    parse_limit,
    parse_timeout,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--max-parallel",
        type=_checked(parse_limit),
        metavar="N",
        help=f"observe at most N boxes at once (default: ${LIMIT_ENV}, else {default_limit()} "
        "on this controller: 32 a core, within its open-file limit)",
    )
    parser.add_argument(
        "--timeout",
        type=_checked(parse_timeout),
        metavar="S",
        help=f"seconds one box may take from its start (default: ${TIMEOUT_ENV}, else "
        f"{DEFAULT_TIMEOUT_S:g}); a box that takes longer is that box's error",
    )


def _checked(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    def check(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return check
