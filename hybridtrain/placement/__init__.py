"""placement: TODO."""
