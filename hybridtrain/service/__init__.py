"""Service: the control plane served on real parts — Prefect on PostgreSQL, an MLflow server, S3, workers.

``stack`` says what runs where (ports, data directories, URLs, each process's command and
environment) as plain values; ``server_log`` reads what the Prefect server's background services
reported; ``doctor`` checks a running stack and names each failing part. Starting and stopping the
processes is ``scripts/stack.py`` (``make up`` / ``make down``).
"""
