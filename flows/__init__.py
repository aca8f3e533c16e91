"""Prefect flows: wire tasks, parameters and subflows — nothing else.

Every process that runs one of these flows imports this package first (the CLI, a worker loading
a deployment's entrypoint, the tests), so it is where two costs of the pinned Prefect are fixed
(the heartbeat stall at the end of each flow run, a TLS context built per client) before any flow
run starts or any client is made (see ``orchestration.prefect_compat``).
"""

from orchestration import prefect_compat

prefect_compat.install()
