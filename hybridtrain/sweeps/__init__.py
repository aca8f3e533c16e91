"""Sweeps: hyperparameter searches over a job's model with Optuna — search space, study, trials, plan, report (Prefect-free)."""
