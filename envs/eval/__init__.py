"""Evaluation statistics and reports."""
