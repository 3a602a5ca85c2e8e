import json

import torch

from eval.bench_policy_update import main, padding
from tests.tiny_model import save_math_policy
from tlt.config import GRPOConfig
from tlt.training.grpo import GRPOBatch


def _batch(lengths: list[int]) -> GRPOBatch:
    T = max(lengths)
    attention = torch.tensor([[t < n for t in range(T)] for n in lengths])
    return GRPOBatch(torch.zeros(len(lengths), T, dtype=torch.long), attention, attention, torch.zeros(len(lengths)))


def _compare(tmp_path, kind: str) -> tuple:
    """Run `--compare kind` on a tiny policy: (output folder, the report's variants)."""
    model = save_math_policy(tmp_path / "model")
    out = tmp_path / "bench"
    args = ["--model", str(model), "--prompts", "2", "--samples", "2", "--max-new-tokens", "8", "--repeats", "1"]
    assert main([*args, "--compare", kind, "--out", str(out)]) == 0
    return out, json.loads((out / "update.json").read_text())["variants"]


def test_padding_counts_the_recompute_and_every_minibatch():
    batch = _batch([100, 20, 20, 20])
    fewest = padding(batch, GRPOConfig(minibatch_size=4, micro_batch_overhead_tokens=10**9), generator_seed=0)
    assert fewest == {"padded": 800, "real": 320, "forwards": 2}  # 4 x 100, twice (recompute, one minibatch)
    cut = padding(batch, GRPOConfig(minibatch_size=4, micro_batch_overhead_tokens=10), generator_seed=0)
    assert cut == {"padded": 320, "real": 320, "forwards": 4}  # [100] and [20, 20, 20], twice


def test_end_to_end_report(tmp_path, capsys):
    model = save_math_policy(tmp_path / "model")
    out = tmp_path / "bench"
    args = ["--model", str(model), "--prompts", "2", "--samples", "3", "--max-new-tokens", "12"]
    assert main(args + ["--minibatch-size", "2", "--repeats", "2", "--out", str(out)]) == 0
    report = json.loads((out / "update.json").read_text())
    assert set(report["variants"]) == {"fewest", "default"}
    for row in report["variants"].values():
        assert len(row["all"]) == 2 and row["seconds"] > 0 and row["padded"] >= row["real"] > 0
    assert report["variants"]["default"]["padded"] <= report["variants"]["fewest"]["padded"]
    assert "| fewest | 32-true | off | 1000000000 |" in (out / "update.md").read_text()
    assert "2 prompts x 3 samples" in capsys.readouterr().out


def test_precision_comparison_runs_both_precisions_on_the_same_cut(tmp_path):
    out, rows = _compare(tmp_path, "precision")
    assert {name: row["precision"] for name, row in rows.items()} == {"32-true": "32-true", "bf16-mixed": "bf16-mixed"}
    assert rows["32-true"]["padded"] == rows["bf16-mixed"]["padded"]
    assert "precisions side by side" in (out / "update.md").read_text()


def test_a_missing_model_is_a_clear_error(tmp_path, capsys):
    assert main(["--model", str(tmp_path / "none"), "--out", str(tmp_path / "o")]) == 2
    assert "no HF model folder" in capsys.readouterr().err


def test_checkpointing_comparison_keeps_fewer_activations(tmp_path):
    out, rows = _compare(tmp_path, "checkpointing")
    assert not rows["stored"]["activation_checkpointing"] and rows["checkpointed"]["activation_checkpointing"]
    assert 0 < rows["checkpointed"]["activation_mib"] < rows["stored"]["activation_mib"]
    assert "activation checkpointing off / on side by side" in (out / "update.md").read_text()
