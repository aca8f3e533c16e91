"""drill: TODO."""
