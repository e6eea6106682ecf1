"""Benchmarks (``downpour bench ...``): each prints a table and writes JSON rows. Tests never time."""
