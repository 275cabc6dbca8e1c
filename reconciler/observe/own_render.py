"""`drift --save-snapshot`: each collector also renders the box's own `.env`.

A snapshot outlives the desired state it was saved against: `reconcile import --from-snapshot`
adopts the boxes' own `.env`, and replaying the snapshot against the adopted state needs
compose's render of that `.env`, which only the box can make. So a saving run asks for it
(payload `render_current`); the collector makes it only where the box's `.env` differs from
the desired one (else one render serves both) and caches it like any render. A drift that
saves nothing never asks: its collector does exactly what it did before.
Which render a comparison then reads: reconciler/compare/render_basis.py.
"""

from __future__ import annotations

from reconciler.drift_inputs import DriftInputs

OWN_RENDER = "render_current"  # the payload key the collector reads


def for_snapshot(inputs: DriftInputs) -> DriftInputs:
    """`inputs` whose payloads ask every collector for the render of the box's own `.env`."""
    payloads = {box: {**payload, OWN_RENDER: True} for box, payload in inputs.payloads.items()}
    return inputs._replace(payloads=payloads)
