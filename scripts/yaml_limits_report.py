"""The four figures of issue 10 class 3 over N generated variants of this repository's YAML.

    .venv/bin/python scripts/yaml_limits_report.py [-n 1368] [--seed 10] [--tree DIR]

Each variant (tests/unit/yaml_mutations.py, the generator of tests/unit/test_generated_inputs.py)
replaces one file of a scratch copy of inventory/ and group_vars/ and loads the desired state
in this process. Counted: tracebacks (any exception but DesiredStateError), hangs (a load
interrupted after --hang seconds), inputs accepted that must be refused, and errors without a
FILE:LINE that exists. `--tree DIR` loads with the `reconciler` package of another checkout
(`git archive <commit> reconciler | tar -x -C DIR`) to measure an older loader. Memory is capped
(--memory-gib) so an alias bomb becomes a MemoryError, counted as a traceback.
"""

from __future__ import annotations

import argparse
import collections
import random
import resource
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

ROOT = Path(__file__).resolve().parents[1]
T = TypeVar("T")


class Hang(BaseException):
    """BaseException: a loader's `except Exception` must not swallow the interruption."""


class RandomDraw:
    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def integer(self, low: int, high: int) -> int:
        return self.rng.randint(low, high)

    def choice(self, options: Sequence[T]) -> T:
        return self.rng.choice(list(options))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("-n", "--variants", type=int, default=1368)
    parser.add_argument("--seed", type=int, default=10)
    parser.add_argument("--hang", type=float, default=10.0, help="seconds before a load is a hang")
    parser.add_argument("--tree", help="load with the reconciler package under this directory")
    parser.add_argument("--memory-gib", type=float, default=2.0)
    parser.add_argument("-v", "--verbose", action="store_true", help="list every bad variant")
    args = parser.parse_args(argv)

    sys.path.insert(0, str(Path(args.tree).resolve() if args.tree else ROOT))
    sys.path.insert(1, str(ROOT))
    from reconciler.desired import load as load_module
    from reconciler.desired.problems import DesiredStateError
    from tests.unit.yaml_mutations import corpus, judge, make_repo, parse_unchanged_once, variant

    limit = int(args.memory_gib * 2**30)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    load_module.load_yaml = parse_unchanged_once(load_module.load_yaml)

    def alarm(signum: int, frame: Any) -> None:
        raise Hang

    signal.signal(signal.SIGALRM, alarm)
    counts: collections.Counter[str] = collections.Counter()
    bad: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    examples: dict[str, str] = {}
    draw = RandomDraw(random.Random(args.seed))
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as scratch:
        root = make_repo(Path(scratch) / "fleet")
        originals = corpus(root)
        for _ in range(args.variants):
            case = variant(draw, originals)
            target = root / case.file
            target.write_bytes(case.content)
            verdict = ""
            signal.setitimer(signal.ITIMER_REAL, args.hang)
            try:
                load_module.load_fleet(root, case.inventory)
                problems: list[Any] = []
            except DesiredStateError as exc:
                problems = list(exc.problems)
            except Hang:
                verdict, problems = "hangs", []
            except BaseException as exc:  # what is being counted
                verdict, problems = "tracebacks", []
                examples.setdefault(f"tracebacks {case.kind}", f"{type(exc).__name__}: {exc}"[:200])
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
            if not verdict:
                outcome = judge(root, problems, case)
                if outcome.unlocated:
                    verdict = "unlocated"
                    examples.setdefault(f"unlocated {case.kind}", outcome.unlocated[0][:200])
                elif outcome.accepted and case.must_refuse:
                    verdict = "accepted"
                    examples.setdefault(f"accepted {case.kind}", f"{case.file}: {case.must_refuse}")
            target.write_bytes(originals[case.file])
            counts["variants"] += 1
            counts["refused" if problems else "loaded"] += 1
            if verdict:
                counts[verdict] += 1
                bad[verdict][case.kind] += 1
    elapsed = time.monotonic() - started
    print(f"variants: {counts['variants']} (seed {args.seed}, {elapsed:.0f} s)")
    print(f"  loaded {counts['loaded']}, refused {counts['refused']}")
    print(f"tracebacks: {counts['tracebacks']}")
    print(f"hangs over {args.hang:g} s: {counts['hangs']}")
    print(f"accepted that should be refused: {counts['accepted']}")
    print(f"errors without FILE:LINE: {counts['unlocated']}")
    for verdict, kinds in bad.items():
        print(f"  {verdict}: " + ", ".join(f"{k} {n}" for k, n in kinds.most_common()))
    if args.verbose:
        for name, text in sorted(examples.items()):
            print(f"    {name}: {text}")
    worst = counts["tracebacks"] + counts["hangs"] + counts["accepted"] + counts["unlocated"]
    return 1 if worst else 0


if __name__ == "__main__":
    sys.exit(main())
