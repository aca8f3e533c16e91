"""datasets: TODO."""
