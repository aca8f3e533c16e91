"""Prefect tasks: each wraps exactly one core call and attaches its retry policy."""
