"""Prefect flows: wire tasks, parameters and subflows — nothing else.

Importing this package fixes two costs of the pinned Prefect (the heartbeat stall at the end of each
flow run, a TLS context built per client; see ``orchestration.prefect_compat``) and makes a user's
mistake (any ``HybridtrainError``) one line without a traceback in a run's log in the UI
(``orchestration.user_errors``), before any flow run starts or any client is made. The CLI and the
tests import it as ``flows.x``; a worker loads a deployment's entrypoint (``flows/drill.py``) by its
path, as a module outside this package, so an entry module reaches this file only through an import of
``flows`` or of a module in it (``flows.lifecycle`` imports ``flows.data``; ``flows.drill`` and
``flows.serving`` import ``flows`` itself).

Every number a deployed flow takes carries its bounds in its type (``Annotated[float, Field(gt=0, le=86400)]``),
the same bounds as the flow's own check. They are in the deployment's parameter schema, which Prefect enforces
when a run is created: the UI's form, ``prefect deployment run --param`` and ``run_deployment`` get a 409 naming
the parameter and no run exists (unless the form's *Validate parameters* switch is turned off for that run). A run
stored with a number beyond 64 bits (``99999999999999999999``; on PostgreSQL also ``1e308``, kept as a 309-digit
integer) makes every later flow-run listing of the server answer 500, the UI's run list included, until it is
deleted (PrefectHQ/prefect#15031); a flow's own check runs too late for that. The numbers inside a model-typed
parameter (the lifecycle's ``spec`` form, a stage's ``approved`` version) get the 64-bit range where they have no
bound of their own (``hybridtrain.specs.schema_bounds``). The checks stay: they give the
one-line message, and cover calls that skip Prefect's validation (``validate_parameters=False``).
"""

from orchestration import prefect_compat, user_errors

prefect_compat.install()
user_errors.install()
