"""Prefect flows: wire tasks, parameters and subflows — nothing else.

Importing this package fixes two costs of the pinned Prefect (the heartbeat stall at the end of each
flow run, a TLS context built per client; see ``orchestration.prefect_compat``) and makes a user's
mistake (any ``HybridtrainError``) one line without a traceback in a run's log in the UI
(``orchestration.user_errors``), before any flow run starts or any client is made. The CLI and the
tests import it as ``flows.x``; a worker loads a deployment's entrypoint (``flows/drill.py``) by its
path, as a module outside this package, so an entry module reaches this file only through an import of
``flows`` or of a module in it (``flows.lifecycle`` imports ``flows.data``; ``flows.drill`` and
``flows.serving`` import ``flows`` itself).
"""

from orchestration import prefect_compat, user_errors

prefect_compat.install()
user_errors.install()
