"""Tracking: MLflow — the tracking store and model registry (``model_registry``) and the lineage a model
version records (``lineage``).
"""
