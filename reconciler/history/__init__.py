"""Run history: every `drift` and `audit` run recorded in a local SQLite store (WAL, schema
versioned), listed by `reconcile history` and compared by `reconcile diff`.

Nothing here is imported before a run's report is printed: recording happens after it, so the
repeated drift pays only for what it records (docs/history-and-metrics.md).
"""
