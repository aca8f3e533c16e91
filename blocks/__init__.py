"""Prefect Blocks: site configuration and credentials, saved idempotently."""
