import pytest

from eval.plot_drift import accept_lengths, main


def _run(folder, values):
    folder.mkdir()
    rows = "".join(f"{i},{v}\n" for i, v in enumerate(values))
    (folder / "metrics.csv").write_text("step,accept_length\n" + rows)
    return folder


def test_reads_both_runs_and_writes_the_plot(tmp_path, capsys):
    frozen = _run(tmp_path / "f", [3.0, 2.5, 2.0])
    adaptive = _run(tmp_path / "a", [3.0, 3.0, 3.0])
    assert accept_lengths(frozen) == [3.0, 2.5, 2.0]
    assert main(["--frozen", str(frozen), "--adaptive", str(adaptive), "--out", str(tmp_path / "d.png")]) == 0
    assert (tmp_path / "d.png").stat().st_size > 1000
    assert "adaptive / frozen = 1.50x" in capsys.readouterr().out


def test_missing_run_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="run `tlt train`"):
        accept_lengths(tmp_path)
