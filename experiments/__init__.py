"""Hydra entry points: single runs, sweeps, benchmarks and plots."""
