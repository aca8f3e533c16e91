"""Simulation: replaying public traces through the production placement engine with a simulated clock
(``simulator``), the jobs and traces it replays (``workload``, ``traces``) and the comparison against
baseline policies (``comparison``).
"""
