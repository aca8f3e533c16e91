"""Serving: models that take records (rows) and return scores, served from signed release targets.

Prefect-free core: ``record_model`` (the MLflow pyfunc that holds featurizer and network),
``model_slot`` (the versions a server holds and the atomic swap between them), ``server`` (the
HTTP app and the watcher that follows a target's ``current`` pointer), ``canary`` (the
comparison that promotes or rolls back a canary by itself), ``edge_export`` (what a small
device runs without our stack).
"""
