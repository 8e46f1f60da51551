"""Benchmarks: `python -m benchmarks [--quick] [NAME...]`."""
