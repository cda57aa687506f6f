"""Benchmarks comparing covey with Stable-Baselines3 (``python -m benchmarks.compare --help``)."""
