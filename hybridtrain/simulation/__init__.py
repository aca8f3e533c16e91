"""simulation: TODO."""
