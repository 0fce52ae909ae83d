"""Temporal activities, one module per external boundary."""
