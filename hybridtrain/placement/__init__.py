"""Placement: where a job runs and why — the policy (``policy``), what a job needs (``request``), the cost
and time model (``cost_model``), queue and spot inputs (``queue_state``, ``spot_market``, ``spot_rule``,
``duration_estimator``), the candidates (``candidate``), the strategies that choose (``strategy``), the engine
(``engine``), its answer (``decision``) and the burst plan for on-prem queues (``burst``). Pure functions of
explicit inputs.
"""
