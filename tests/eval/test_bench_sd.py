"""tlt.eval.bench.sd.cli: end to end on a random target (every configuration reported, greedy SD identical to plain)
and exact checks of its small helpers."""

import json

import pytest
import torch

from tlt.drafters.eagle import EagleDrafter
from tlt.drafters.small_lm import SmallLMDrafter
from tlt.eval.bench.sd import runs
from tlt.eval.bench.sd.cli import build_parser, main, settings_from_args
from tlt.eval.bench.sd.costs import speedup_bound
from tlt.eval.bench.sd.report import first_mismatch
from tlt.eval.bench.sd.runs import RunOutput, measure_cells, post_eos_share, prompt_batches
from tlt.eval.bench.sd.settings import NATIVE, BenchSettings, Cell, plan_cells
from tlt.models.io import save_hf_folder
from tlt.models.presets import build_model
from tlt.models.tokenizer import train_tokenizer

TEXTS = ["Question: Calculate 3 + 4 - 1.\nSolution:\n3 + 4 = 7, 7 - 1 = 6. \\boxed{6}", "Solve step by step."]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """A saved random test-preset target (weights scaled up so greedy continuations vary and ties are rare;
    seeded so that no greedy row meets EOS, every row runs to max_new_tokens), an untrained EAGLE drafter and a
    random small_lm drafter for it."""
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("bench_sd")
    tokenizer = train_tokenizer(TEXTS * 4, vocab_size=300)
    ids = (tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id)
    model = build_model("test", len(tokenizer), *ids)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.fill_(1.0)
            else:
                p.normal_(0, 0.15, generator=g)
    save_hf_folder(model, tokenizer, root / "model")
    EagleDrafter.from_target(model).save(root / "eagle")
    SmallLMDrafter.from_preset("test", len(tokenizer), seed=1).save(root / "small_lm")
    return root


def test_bench_sd_reports_every_config_with_greedy_identity(folders, tmp_path):
    argv = [
        "--target", str(folders / "model"), "--eagle", str(folders / "eagle"), "--eagle-int8",
        "--small-lm", str(folders / "small_lm"), "--out", str(tmp_path), "--batch-sizes", "1,2",
        "--strategies", "2_1_3", "--temperatures", "0,1", "--max-new-tokens", "8", "--min-prompts", "1",
        "--repeats", "1", "--warmup", "0", "--hf-batch-sizes", "1", "--cost-reps", "1",
    ]  # fmt: skip
    assert main(argv) == 0
    payload = json.loads((tmp_path / "results.json").read_text())
    planned = plan_cells(settings_from_args(build_parser().parse_args(argv)))
    assert [c["name"] for c in payload["cells"]] == [c.name for c in planned]
    sd = {(r["drafter"], r["batch_size"], r["temperature"]) for r in payload["sd"]}
    kinds = ("eagle", "eagle_int8", "small_lm", "ngram")
    assert sd == {(d, b, t) for d in kinds for b in (1, 2) for t in (0.0, 1.0)}
    greedy = [r for r in payload["sd"] if r["temperature"] == 0]
    assert payload["identity"] == {"ok": True, "checked": 8, "failed": []}
    assert all(r["identical"] and r["bound"] > 0 and r["mean_running_batch"] == r["batch_size"] for r in greedy)
    assert all(c["generated_tokens"] == 8 * c["num_prompts"] for c in payload["cells"])  # EOS ignored
    peers = {r["comparison"] for r in payload["peers"]}
    assert {
        "plain native vs HF generate",
        "best native SD vs HF assistant",
        "best native SD vs HF lookup",
    } <= peers
    assert (tmp_path / "results.md").read_text().startswith("# Speculative decoding benchmark")
    assert (tmp_path / "speedup.png").read_bytes()[:4] == b"\x89PNG"


def test_bad_arguments_exit_2(folders, tmp_path):
    argv = ["--target", str(folders / "model"), "--out", str(tmp_path), "--strategies", "4_1_9"]
    assert main(argv) == 2


def test_prompt_batches_cover_min_prompts_with_distinct_prompts():
    prompts = [[i] for i in range(8)]
    assert prompt_batches(prompts, 3, 5) == [[[0], [1], [2]], [[3], [4], [5]]]
    assert prompt_batches(prompts, 4, 1) == [[[0], [1], [2], [3]]]


def test_first_mismatch_and_post_eos_share():
    assert first_mismatch([[1, 2], [3, 4, 5]], [[1, 2], [3, 4, 5]]) is None
    assert first_mismatch([[1, 2], [3, 9, 5]], [[1, 2], [3, 4, 5]]) == "prompt 1, token 1"
    assert first_mismatch([[1, 2]], [[1, 2, 3]]) == "prompt 0, token 2"
    assert post_eos_share([[5, 2, 7, 7], [5, 5, 5, 2]], eos=2) == 2 / 8
    assert post_eos_share([[5, 2, 7]], eos=None) == 0


def test_speedup_bound():
    # 3 tokens per verify; verify costs 2 plain steps, drafting 1 more: 3 * 1 / (2 + 1) = 1
    assert speedup_bound(3.0, t_plain=1.0, t_verify=2.0, propose_seconds=1.0) == 1.0
    assert speedup_bound(4.0, t_plain=0.01, t_verify=0.015, propose_seconds=0.005) == pytest.approx(2.0)


def test_cells_take_turns_round_by_round_after_their_warm_ups(monkeypatch):
    """Each cell warms up when built; then every round runs every cell once, in an order rotated by the round, and
    each cell's medians come from its own timed runs."""
    calls = []

    def runner(work, cell, settings):
        def run():
            calls.append(cell.batch_size)
            return RunOutput(float(cell.batch_size * (len(calls) + 1)), [[1, 2, 3]], [])

        return run

    monkeypatch.setitem(runs.RUNNERS, NATIVE, runner)
    cells = [Cell(NATIVE, b) for b in (1, 2, 4)]
    settings = BenchSettings(target="t", out="o", warmup=1, repeats=3)
    work = type("Work", (), {"tokenizer": type("Tok", (), {"eos_token_id": None})()})()
    results = measure_cells(work, cells, settings)
    assert calls == [1, 2, 4] + [1, 2, 4] + [2, 4, 1] + [4, 1, 2]
    assert [results[c].seconds for c in cells] == [[5.0, 10.0, 12.0], [12.0, 16.0, 26.0], [28.0, 36.0, 44.0]]
    assert all(r.deterministic and r.generated_tokens == 3 for r in results.values())


def test_sd_rows_pair_each_timed_run_with_the_plain_run_of_its_round():
    from tlt.eval.bench.sd.costs import ForwardCost
    from tlt.eval.bench.sd.report import sd_row
    from tlt.eval.bench.sd.runs import CellResult

    def result(cell, seconds, tokens):
        return CellResult(
            cell=cell, seconds=seconds, generated_tokens=tokens, num_prompts=1, mean_running_batch=1, sd_steps=1,
            accepted_per_verify=1.0, propose_seconds=0.001, post_eos_share=0.0, deterministic=True,
            memory={"delta_mib": 0, "peak_rss_mib": 0}, outputs=[[1]],
        )  # fmt: skip

    sd_cell = Cell(NATIVE, 1, 1.0, "eagle", "3_1_4")
    plain = result(sd_cell.plain(), [1.0, 2.0, 4.0], 100)  # the machine slows down round by round
    sd = result(sd_cell, [0.5, 1.0, 1.0], 50)
    costs = [ForwardCost(batch_size=1, new_tokens=n, cache_len=8, seconds=0.01) for n in (1, 4)]
    row = sd_row(sd, plain, costs)
    assert row.speedup_runs == [1.0, 1.0, 2.0]  # 50 / 0.5 over 100 / 1, then 50 / 1 over 100 / 2, 50 / 1 over 100 / 4
    assert row.speedup == (50 / 1.0) / (100 / 2.0)  # the ratio of the medians
