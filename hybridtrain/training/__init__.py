"""training: TODO."""
