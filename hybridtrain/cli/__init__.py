"""CLI: the core ``hybridtrain`` commands — validate, schema, data, status, drill (``main``), plan and simulate
(``placement``), audit, ledger, rollback and retire (``governance``). No Prefect here: the commands that
need a Prefect server (init, run, demo, deploy, credentials) join this app in ``orchestration.cli``.
"""
