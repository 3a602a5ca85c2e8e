import json

import torch

from eval.bench_sharding import main, synthetic_batch


def test_synthetic_batch_has_a_long_tail_within_the_cap():
    batch = synthetic_batch(256, median_len=60, max_len=384, seed=1)
    responses = batch.response_mask.sum(1).float()
    assert 40 <= responses.median() <= 80 and responses.max() <= 384
    assert torch.quantile(responses, 0.99) / responses.median() >= 4  # p99 / p50, as rollouts are


def test_report_counts_each_variants_state_from_its_tensors(tmp_path, capsys):
    out = tmp_path / "bench"
    assert main(["--preset", "test", "--rows", "8", "--repeats", "1", "--max-len", "48", "--out", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    rank0 = report["ranks"][0]
    replicate, fsdp = rank0["memory"]["replicate"], rank0["memory"]["fsdp"]
    full = rank0["params"] * 4  # float32 bytes
    steps = 4 * 64  # AdamW's scalar step counts: 4 bytes per tensor, < 64 tensors
    assert replicate["params"] == replicate["grads"] == full and replicate["replica"] == 0
    assert 0 < replicate["optimizer"] - 2 * full < steps  # two moments per parameter
    assert fsdp["replica"] == full and abs(fsdp["params"] - full / 2) <= 4096  # each rank's half, up to rounding
    assert abs(fsdp["optimizer"] - full) <= 8192 + steps
    for variant in ("replicate", "fsdp"):
        assert len(rank0["seconds"][variant]) == 1 and rank0["seconds"][variant][0] > 0
    assert "| fsdp |" in (out / "report.md").read_text() and "fsdp / replicate update time" in capsys.readouterr().out
