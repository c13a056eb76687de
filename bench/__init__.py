"""Benchmarks: each bench/bench_*.py module has main() and prints its figures.

`make bench` runs them all (`python -m bench`); `python -m bench scheduler` runs the
modules whose name contains "scheduler".
"""
