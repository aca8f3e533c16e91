"""remote: TODO."""
