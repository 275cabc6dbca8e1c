"""What `reconcile import` prints: what was written, and what was found while importing: the
notes of adoption (`.env` against the containers, defaults taken) and the drift that the
adopted state still shows, as `reconcile drift` renders it (secrets `***`), each cause with
why no desired state removes it. Never a secret value."""

from __future__ import annotations

from datetime import UTC, datetime

from reconciler.compare.drift import DriftReport
from reconciler.importer.result import EXIT_ERROR, EXIT_FOUND, EXIT_OK, Imported
from reconciler.importer.why import reason
from reconciler.report.values import clean, free_text


def remaining(done: Imported, inventory: str) -> DriftReport:
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return DriftReport(tuple(done.results), inventory, now, "import")


def reasons(report: DriftReport, done: Imported) -> list[str]:
    """One line per distinct (box, reason), in the report's order."""
    seen: dict[tuple[str, str], list[str]] = {}
    for d in report.drifts:
        why = reason(d, done.expectations.get(d.box), done.snapshot)
        seen.setdefault((d.box, why), []).append(d.path)
    return [
        f"{box}: {why} ({', '.join(dict.fromkeys(paths))})" for (box, why), paths in seen.items()
    ]


def print_report(done: Imported, inventory: str, snapshot: str | None) -> int:
    print(f"wrote {clean(str(done.output))}: {', '.join(done.files)}")
    print(f"adopted {len(done.boxes)} box{'es' if len(done.boxes) != 1 else ''}:")
    for line in done.boxes:
        print(f"  {line}")
    if done.failed:
        # Exit 1 even though a repository was written: a script must notice it lacks boxes.
        print(f"\nfailed, not adopted (--partial; nothing written for them), exit {EXIT_ERROR}:")
        for box, why in done.failed.items():
            print(f"  {free_text(f'{box}: {why[0]}')}")
            for more in why[1:]:
                print(f"    {free_text(more)}")
    report = remaining(done, inventory)
    # Findings, errors and reasons quote the boxes (a gateway's version, a section's error):
    # scrubbed and cleaned, as the drift report shows the same text.
    notes = [free_text(f"{f.box}: {f.what}") for f in done.findings]
    errors = [free_text(f"{b.box}: {e}") for b in report.boxes for e in b.errors]
    if notes or errors or report.drifts:
        print("\nfound while importing:")
        for line in notes + errors:
            print(f"  {line}")
    if report.drifts:
        print(f"  {len(report.drifts)} differences remain; no desired state removes them:")
        for line in reasons(report, done):
            print(f"    {free_text(line)}")
    # Paths escaped: one that is not UTF-8 would end the report in a UnicodeEncodeError.
    replay = f" --from-snapshot {clean(str(snapshot))}" if snapshot else ""
    root = clean(str(done.output))
    print(f"\ndetails and check: reconcile --root {root} -i {inventory} drift{replay}")
    if done.failed:
        return EXIT_ERROR
    return EXIT_FOUND if notes or errors or report.drifts else EXIT_OK
