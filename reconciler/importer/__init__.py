"""`reconcile import`: adopt running boxes into a desired state that drifts zero.

One-way flow: observations (live, or a saved snapshot) -> one adopted tree per box, each value
carrying where it was found (adopt.py and its helpers) -> layers (factor.py: values every box
shares into all.yaml, then the groups, the rest per box) -> YAML with an end-of-line comment per
value (yaml_out.py) -> a new repository written atomically and checked with the project's own
loader and comparison (write.py, verify.py). Never imported by `reconcile drift`.
"""
