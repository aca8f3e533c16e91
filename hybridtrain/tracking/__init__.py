"""tracking: TODO."""
