"""Prefect flows: wire tasks, parameters and subflows — nothing else."""
