"""Converge: the drift engine's plan applied to a box, verified, or rolled back.

`engine` orders the work, `remote/converge.py` does it on the box (one process, one lock),
`operation` is the pyinfra operation over it, `cli` the `reconcile apply|rollback|snapshots`
commands. roles/box.py and deploys/*.py are the pyinfra entry points.
"""
