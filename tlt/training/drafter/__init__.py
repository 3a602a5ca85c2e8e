"""Drafter training: offline distillation (distill), and online during RL: samples from the rollout (buffer),
packed batches (packing), the loss (loss, module), spot training on idle workers (spot), snapshots (checkpoint)."""
