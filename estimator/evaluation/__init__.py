"""Evaluation: specs to columns, the one vectorized path to a results table, intervals, and the public API."""
