import numpy as np
import pytest

from tests.tiny_model import save_math_policy
from tlt.eval.bench.sd.sampling_parity import Side, compare, main


def _side(rewards, lengths, logprobs) -> Side:
    return Side(np.array(rewards, dtype=float), np.array(lengths), np.array(logprobs, dtype=float), 1.0, 0.0)


def test_identical_sides_show_no_difference():
    side = _side([[1, 0], [0, 0], [1, 1]], [5, 9, 30, 7, 8, 12], [-0.5, -0.7, -0.2, -0.9, -0.4, -0.6])
    result = compare(side, side)
    assert result["reward_diff"] == 0.0 and result["reward_paired_t_p"] == 1.0
    assert result["length_ks_p"] == pytest.approx(1.0) and result["logprob_ks_p"] == pytest.approx(1.0)


def test_a_shifted_distribution_is_flagged():
    rng = np.random.default_rng(0)
    P, N = 64, 8
    plain = _side(rng.random((P, N)) < 0.3, rng.integers(10, 100, P * N), rng.normal(-0.7, 0.1, P * N))
    biased = _side(rng.random((P, N)) < 0.6, rng.integers(40, 130, P * N), rng.normal(-0.5, 0.1, P * N))
    result = compare(plain, biased)
    assert result["reward_diff"] > 0.2 and result["reward_paired_t_p"] < 1e-6
    assert result["length_ks_p"] < 1e-6 and result["logprob_ks_p"] < 1e-6


def test_end_to_end_report_with_the_ngram_drafter(tmp_path, capsys):
    target = save_math_policy(tmp_path / "model")
    out = tmp_path / "parity.md"
    args = ["--target", str(target), "--drafter", "ngram", "--strategy", "3_1_4", "--prompts", "4"]
    assert main(args + ["--samples", "3", "--max-new-tokens", "12", "--out", str(out)]) == 0
    text = out.read_text()
    assert text == capsys.readouterr().out.split("[parity] SD: 4 prompts x 3 samples\n")[1]
    assert "4 held-out prompts x 3 samples per side" in text and "| accept length (tokens per verify) | - |" in text
    p_values = [float(line.rsplit("p = ", 1)[1].split(",")[0]) for line in text.splitlines() if "p = " in line]
    assert len(p_values) == 3 and all(0 <= p <= 1 for p in p_values)


def test_greedy_and_tiny_runs_are_refused(tmp_path):
    with pytest.raises(SystemExit):
        main(["--target", str(tmp_path), "--drafter", "ngram", "--temperature", "0"])
    with pytest.raises(SystemExit):
        main(["--target", str(tmp_path), "--drafter", "ngram", "--prompts", "1"])
