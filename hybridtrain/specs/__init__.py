"""specs: TODO."""
