"""Experiment harness: configs, baselines, and the demo."""
