"""Figures from experiment results files (experiments/results/*.json); nothing is typed in."""
