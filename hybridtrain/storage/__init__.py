"""storage: TODO."""
