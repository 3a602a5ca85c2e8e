"""The benchmarks behind `tlt bench`: rollout (sd: speculative decoding against plain decoding and HF generate),
adaptive (the strategy tuners on a long-tail workload), packing (drafter-training throughput)."""
