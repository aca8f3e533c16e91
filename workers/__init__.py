"""Launchers for process work pools: start flow runs in pre-warmed Python processes (no Prefect import here)."""
