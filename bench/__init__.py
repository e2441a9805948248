"""Benchmarks: each prints its figures beside baselines measured in the same run."""
