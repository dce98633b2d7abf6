"""Benchmark scripts: each prints measured ratios against a baseline run side by side."""
