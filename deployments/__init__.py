"""Deployment bootstrap: work pools, blocks and deployments on a Prefect server (idempotent)."""
