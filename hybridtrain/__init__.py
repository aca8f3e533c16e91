"""hybridtrain: a control plane for ML training across on-prem GPU servers and cloud GPUs.

The core package is plain Python (it never imports Prefect); the Prefect shell lives in the
top-level ``flows``, ``tasks``, ``blocks`` and ``deployments`` packages.
"""

__version__ = "0.1.0"
