"""Hydra configs of experiments.run (a package, so Hydra finds them as pkg://experiments.conf when the app runs
in-process)."""
