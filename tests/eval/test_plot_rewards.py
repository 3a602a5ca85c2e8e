import pytest

from eval.plot_rewards import main, moving_average, window_means


def _run(folder, rewards):
    folder.mkdir()
    rows = "".join(f"{i},{r}\n" for i, r in enumerate(rewards))
    (folder / "metrics.csv").write_text("step,reward_mean\n" + rows)
    return folder


def test_window_and_moving_means():
    assert window_means([1.0, 2.0, 3.0, 4.0, 5.0], 2) == [1.5, 3.5, 5.0]
    assert moving_average([1.0, 2.0, 3.0, 4.0], 2) == [1.0, 1.5, 2.5, 3.5]


def test_tables_and_plots_every_run(tmp_path, capsys):
    a = _run(tmp_path / "a", [0.0, 0.5, 1.0, 1.0])
    b = _run(tmp_path / "b", [0.25, 0.25, 0.75])
    out = tmp_path / "r.png"
    assert main([f"base={a}", f"tlt={b}", "--window", "2", "--out", str(out)]) == 0
    assert out.stat().st_size > 1000
    table = capsys.readouterr().out
    assert "| steps | base | tlt |" in table
    assert "| 0-1 | 0.250 | 0.250 |" in table and "| 2-3 | 1.000 | 0.750 |" in table


def test_bad_arguments_are_clear_errors(tmp_path):
    with pytest.raises(SystemExit):
        main(["no-label", "--out", str(tmp_path / "r.png")])
    with pytest.raises(FileNotFoundError, match="run `tlt train`"):
        main([f"x={tmp_path}", "--out", str(tmp_path / "r.png")])
    (tmp_path / "metrics.csv").write_text("step,accept_length\n0,1.0\n")
    with pytest.raises(KeyError, match="no column 'reward_mean'"):
        main([f"x={tmp_path}", "--out", str(tmp_path / "r.png")])
