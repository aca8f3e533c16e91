"""Orchestration: the Prefect machinery that is neither a flow nor a one-call task.

The process's session — Prefect pointed at the workspace, the embedded server tied to the
process, set-up done implicitly (``session``) — and the runs a killed process left RUNNING
(``stale_runs``); dispatching a stage to a site's work pool (``dispatch``), the workspace a flow run works in
(``context``), each site's training queue as the Prefect server sees it (``queues``), the
one-training-per-job lease (``training_lease``), fixes for the pinned Prefect
release (``prefect_compat``) and the ``hybridtrain`` command line that adds the Prefect-wired
commands (init, run, demo, deploy, credentials) to the core's (``cli``).
"""
