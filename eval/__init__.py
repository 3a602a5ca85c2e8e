"""Scripts that measure and report (`python -m eval.<name>`): benchmarks outside `tlt bench`, peer runs, the
claims table, plots. The library they share lives in tlt.eval."""
