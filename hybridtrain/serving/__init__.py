"""Serving: models that take records (rows) and return scores, served from signed release targets.

Prefect-free core (the model formats themselves live in ``hybridtrain.training``: ``record_model``, the MLflow
pyfunc that holds featurizer and network, and ``edge_export``): ``model_slot`` (the versions a server holds and the atomic swap between them), ``server`` (the
HTTP app and the watcher that follows a target's ``current`` pointer), ``canary`` (the
comparison that promotes or rolls back a canary by itself).
"""
