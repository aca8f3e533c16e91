"""governance: TODO."""
