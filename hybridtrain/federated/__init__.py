"""Federated: training that goes to the data — per-site local rounds, aggregation, round state and checkpoints.

The core of federated training, Prefect-free: ``planning`` (centralized or federated, and why),
``features`` (one featurizer from every site's statistics), ``local`` (a site's local epochs from
the global weights), ``aggregation`` (FedAvg / FedProx), ``secure_aggregation`` (pairwise-masked
updates: the aggregator learns only their sum), ``rounds`` (round state, the global
model's checkpoints, resume) and ``site`` (what runs at a data site: prepare, train a round,
send the update through ``hybridtrain.datasets.transfer``), and for a data site with SSH hosts
``remote_round`` (its round run on the host over SSH) with ``host_round`` (the host's entry
point). ``flows/federated.py`` dispatches the site steps to the sites' work pools.
"""
