"""`tlt bench rollout`: speculative decoding's speed per drafter, strategy and batch size. cli runs the cells
(settings plans them, runs measures one, costs times the forwards, report and render write the tables and plot);
sampling_parity checks that sampled SD draws from the target's distribution."""
