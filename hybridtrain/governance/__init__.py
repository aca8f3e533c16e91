"""Governance: what makes a model releasable and accountable — promotion gates (``gates``), signed bundles
(``bundle``, ``signing_key``), promotion and rollback (``promotion``), release targets (``release``), the
hash-chained audit log (``audit_log``) and the cost ledger (``ledger``).
"""
