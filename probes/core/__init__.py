"""Machinery shared by every probe: statistics today; the runner, fitters, baselines, MDL, scalar
mix, depth and geometry move here as the probes become one package each (ARCHITECTURE.md)."""
