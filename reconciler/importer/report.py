"""What `reconcile import` prints: what was written, what was adopted from where, and what was
found while importing (the drift a desired state cannot remove), never a value of a secret."""

from __future__ import annotations

from reconciler.compare.drift import Drift
from reconciler.importer.result import EXIT_FOUND, EXIT_OK, Imported


def _drift_line(d: Drift) -> str:
    where = f" ({d.source})" if d.source else ""
    note = f": {d.note}" if d.note else ""
    return f"{d.box}: {d.kind} {d.subject} {d.path} -> {d.action}{where}{note}"


def found_lines(done: Imported) -> list[str]:
    lines = [f"{f.box}: {f.what}" for f in done.findings]
    for result in done.results:
        lines += [_drift_line(d) for d in result.drifts]
        lines += [f"{result.box}: error {e}" for e in result.errors]
    return lines


def print_report(done: Imported, inventory: str, snapshot: str | None) -> int:
    print(f"wrote {done.output}: {', '.join(done.files)}")
    print(
        f"adopted {len(done.boxes)} box{'es' if len(done.boxes) != 1 else ''}: "
        f"{', '.join(done.boxes)}"
    )
    found = found_lines(done)
    if found:
        print(f"\nfound while importing ({len(found)}):")
        for line in found:
            print(f"  {line}")
    replay = f" --from-snapshot {snapshot}" if snapshot else ""
    print(f"\ncheck: reconcile --root {done.output} -i {inventory} drift{replay}")
    return EXIT_FOUND if found else EXIT_OK
