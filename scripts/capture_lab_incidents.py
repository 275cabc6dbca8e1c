"""Reproduce the field incidents on the lab and save what `reconcile drift` observed.

Writes examples/lab-incidents/: a self-contained fleet root (the inventory, group_vars and lab
facts used at capture time) plus the snapshot, so that

    reconcile --root examples/lab-incidents -i lab drift \
        --from-snapshot examples/lab-incidents/snapshot

shows the incidents' drift on a machine with no access to the boxes. The unit tests of the
compare rules run on this captured data. Secrets were hashed on the boxes before they left.

    .venv/bin/python scripts/capture_lab_incidents.py      # needs the lab (python -m lab up)
"""

from __future__ import annotations

import fcntl
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import lab  # noqa: E402
from lab import config  # noqa: E402
from reconciler.desired.load import load_fleet  # noqa: E402
from reconciler.drift import run_drift  # noqa: E402

OUT = ROOT / "examples" / "lab-incidents"

# One incident per line, as an operator did them (seed 000 §8-§9, lobes' docs); spread over
# the three boxes so one snapshot holds them all.
INCIDENTS = [
    ("window_change_lane_only", "thor", ("WORKER_MAX_MODEL_LEN", 131072)),
    ("shell_exported_key", "thor", ("GATEWAY_API_KEY",)),
    ("hardcoded_flag", "spark", ("vllm-primary", "--max-model-len=131072")),
    ("other_image_digest", "orin", ("vllm-embed",)),
    ("gateway_published_on", "orin", ("127.0.0.1",)),
]


def main() -> int:
    config.LAB_DIR.mkdir(parents=True, exist_ok=True)
    with open(config.LAB_DIR / "session.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        lab.up()
        try:
            done = []
            for name, box, args in INCIDENTS:
                lab.incidents.INCIDENTS[name](box, *args)
                done.append(f"{box}: {name} {' '.join(map(str, args))}")
                # Not the commands: the shell incident's carry the key it exported.
                print(f"reproduced {done[-1]}")
            write_example(done)
        finally:
            lab.incidents.reset()
    return 0


def write_example(done: list[str]) -> None:
    if OUT.exists():
        shutil.rmtree(OUT)
    (OUT / "facts").mkdir(parents=True)
    shutil.copytree(ROOT / "group_vars", OUT / "group_vars")
    shutil.copytree(ROOT / "inventory", OUT / "inventory")
    shutil.copy(config.LAB_DIR / "images.yaml", OUT / "facts" / "images.yaml")
    shutil.copytree(config.LAB_DIR / "overlay", OUT / "facts" / "overlay")
    inventory = OUT / "inventory" / "lab.yaml"
    inventory.write_text(
        inventory.read_text()
        .replace(".lab/images.yaml", "facts/images.yaml")
        .replace(".lab/overlay/", "facts/overlay/")
    )
    fleet = load_fleet(OUT, "lab")
    run = run_drift(fleet, list(fleet.boxes), save_to=OUT / "snapshot")
    lines = [
        "# The lab's field incidents, observed",
        "",
        "Captured by `scripts/capture_lab_incidents.py` on the three-box lab, after:",
        "",
        *[f"- {line}" for line in done],
        "",
        "Replay offline (exit code 2: drift):",
        "",
        "    reconcile --root examples/lab-incidents -i lab drift \\",
        "        --from-snapshot examples/lab-incidents/snapshot",
        "",
        f"At capture: {len(run.report.drifts)} differences; secrets were hashed on the boxes.",
        "",
    ]
    (OUT / "README.md").write_text("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
