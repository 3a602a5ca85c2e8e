"""Evaluation and ablation harness: benchmarks and reports run as scripts (`python -m eval.<name>`)."""
