"""Helpers for running the services locally: the demo, the benchmarks and the tests use
them; no service imports them."""
