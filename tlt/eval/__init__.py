"""The harness: held-out accuracy (heldout), lm-eval parity reports (lm, lm_tasks, parity*), the TLT-on-vs-off
comparison (compare), config-grid sweeps (sweep) and the benchmarks behind `tlt bench` (bench)."""
