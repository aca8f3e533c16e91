"""Reporting: what people see of a lifecycle while it runs and after — progress events and pictures."""
