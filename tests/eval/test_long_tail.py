import json

from eval.long_tail import by_range, decode_by_strategy, main


def _history(timelines):
    return [{"step": i, "timeline": t} for i, t in enumerate(timelines)]


def test_decomposition_by_batch_size_by_hand(tmp_path, capsys):
    warm = [[16, "", 10, 100.0, 160]]  # the warm-up step is left out
    base = _history([warm, [[16, "", 10, 4.0, 160], [1, "", 100, 2.0, 100]]])
    tlt = _history([warm, [[16, "", 10, 4.0, 160], [1, "5_1_6", 25, 0.75, 100]]])
    cells = by_range(decode_by_strategy(tlt, warmup=1))
    assert cells["1"] == {"steps": 25, "sd_steps": 25, "sd_rows": 25, "seconds": 0.75, "tokens": 100}
    assert cells["9-16"]["sd_steps"] == 0
    run = tmp_path / "run"
    for arm, history in (("", tlt), ("baseline", base)):
        folder = run / arm / "checkpoint"
        folder.mkdir(parents=True)
        (folder / "metrics.json").write_text(json.dumps(history))
    out = tmp_path / "tail.md"
    assert main([str(run), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    # batch 1: baseline 2 s of 6 (33%), 20 ms / token; TLT 0.75 s of 4.75 (16%), 7.5 ms / token, 4 tokens a step
    assert "| 1 | 33% | 16% | 20.00 | 7.50 | 100% | 4.00 | 2.67x |" in text
    assert "| 9-16 | 67% | 84% | 25.00 | 25.00 | 0% | - | 1.00x |" in text
    assert "s over decode steps 1.26x" in text
    # by what TLT played: batch 1 ran 5_1_6 in 25 steps of 1 row, 30 ms a step, 4 tokens each, 7.5 ms / token
    assert "| 1 | 5_1_6 | 25 | 1.0 | 30.0 | 4.00 | 7.50 | 2.67x |" in text
    assert "| 9-16 | plain | 10 | 16.0 | 400.0 | 1.00 | 25.00 | 1.00x |" in text
    assert main(["--from-json", str(out.with_suffix(".json"))]) == 0
    assert capsys.readouterr().out == text
