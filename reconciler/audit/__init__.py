"""`reconcile audit`: who can call what on the mesh, and why, with evidence per box.

observe.py   one observation per box (the drift collector with its audit section) plus the
             controller's probes from the mesh side, then the live weakest-link proofs;
evidence.py  typed evidence rows built from those observations (pure);
verdict.py   the rules: evidence -> findings with a severity -> a verdict per box and mesh (pure);
report_*.py  text (a matrix), versioned JSON (schema/audit-report.schema.json), markdown.
"""
