"""The packing benchmark's pieces: long-tailed lengths, identical batches for both layouts, a smoke run."""

import json

from tlt.eval.bench.packing import PackingBenchSettings, draw_batches, main, make_buffer, rollout_lengths


def test_lengths_are_long_tailed_and_capped():
    s = PackingBenchSettings(samples=400, max_len=512, median_response=48, sigma=1.2)
    lengths = sorted(rollout_lengths(s))
    assert lengths == sorted(rollout_lengths(s)) and max(lengths) == 512  # seeded; some truncated
    assert lengths[len(lengths) // 2] < 512 / 3 and min(lengths) >= s.prompt_tokens + 2


def test_batches_cover_the_buffer_once():
    s = PackingBenchSettings(samples=40, max_len=128, median_response=16, batch_tokens=256)
    buffer = make_buffer(s, hidden_size=8)
    batches = draw_batches(buffer, s)
    drawn = sum(x.num_tokens for b in batches for x in b)
    assert drawn >= sum(x.num_tokens for x in buffer.samples) > drawn - max(s.batch_tokens, s.max_len)


def test_smoke_run_writes_json(tmp_path):
    out = tmp_path / "packing.json"
    result = main(
        [
            "--samples",
            "12",
            "--max-len",
            "96",
            "--median-response",
            "16",
            "--batch-tokens",
            "256",
            "--repeats",
            "1",
            "--out",
            str(out),
        ]
    )
    saved = json.loads(out.read_text())
    assert saved["ratio"] == result["ratio"] > 0
    runs = saved["runs"]
    assert runs["packed"][0]["trained_tokens"] == runs["padded"][0]["trained_tokens"]  # same tokens
    assert runs["packed"][0]["laid_out_tokens"] <= runs["padded"][0]["laid_out_tokens"]
