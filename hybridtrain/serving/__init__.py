"""Serving: models that take records (rows) and return scores, served from signed release targets.

Prefect-free core (the model formats themselves live in ``hybridtrain.training``: ``record_model``, the MLflow
pyfunc that holds featurizer and network, and ``edge_export``): ``server`` (the HTTP app, the
versions a server holds and the atomic swap between them, the watcher that follows a target's
``current`` pointer), ``request`` (the hot path's check of a request's records against the
model's schema), ``canary`` (the comparison that promotes or rolls back a canary by itself),
``service`` (from a workspace and a target's name to a ready server).
"""
