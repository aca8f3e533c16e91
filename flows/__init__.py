"""Prefect flows: wire tasks, parameters and subflows — nothing else.

Every process that runs one of these flows imports this package first (the CLI, a worker loading
a deployment's entrypoint, the tests), so it is where the pinned Prefect's heartbeat stall is
fixed, before any flow run starts (see ``flows.prefect_compat``).
"""

from flows import prefect_compat

prefect_compat.install()
