"""tlt.files: a failed write leaves the old file or folder as it was and no temporary behind."""

import pytest
import torch

from tlt.files import (
    atomic_folder,
    atomic_write_json,
    atomic_write_text,
    check_saved_files,
    read_json,
    write_report,
)


def test_a_folder_is_replaced_only_when_its_block_succeeds(tmp_path):
    target = tmp_path / "ckpt"
    with atomic_folder(target) as tmp:
        (tmp / "a.txt").write_text("v1")
    with pytest.raises(RuntimeError), atomic_folder(target) as tmp:
        (tmp / "a.txt").write_text("half")
        raise RuntimeError("crash while writing")
    assert (target / "a.txt").read_text() == "v1"
    with atomic_folder(target) as tmp:
        (tmp / "b.txt").write_text("v2")
    assert sorted(p.name for p in target.iterdir()) == ["b.txt"]
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]  # no temporary or old folder left


def test_a_file_keeps_its_old_content_when_the_write_fails(tmp_path):
    path = tmp_path / "report" / "r.json"
    atomic_write_json(path, {"a": 1})
    with pytest.raises(TypeError):
        atomic_write_text(path, None)
    assert path.read_text() == '{\n  "a": 1\n}\n' and [p.name for p in path.parent.iterdir()] == ["r.json"]
    assert oct(path.stat().st_mode)[-3:] == "644"


def test_a_report_keeps_its_json_when_the_render_fails(tmp_path):
    path = tmp_path / "out" / "bench.md"
    assert write_report(path, {"x": 1}, lambda r: f"x = {r['x']}\n") == "x = 1\n"
    assert path.read_text() == "x = 1\n" and (tmp_path / "out" / "bench.json").read_text() == '{\n  "x": 1\n}\n'
    with pytest.raises(KeyError):
        write_report(path, {"y": 2}, lambda r: f"x = {r['x']}\n")
    assert (tmp_path / "out" / "bench.json").read_text() == '{\n  "y": 2\n}\n' and path.read_text() == "x = 1\n"


def test_a_file_that_is_not_json_is_named_with_where_it_broke(tmp_path):
    path = tmp_path / "card.json"
    atomic_write_json(path, {"a": [1, 2]})
    assert read_json(path) == {"a": [1, 2]}
    path.write_text('{"a": [1, 2]\n "b": 3}')
    with pytest.raises(ValueError, match=r"card.json: not valid JSON at line 2, column 2 \(Expecting ',' delimiter\)"):
        read_json(path)


def test_a_damaged_saved_file_is_named_and_a_sound_folder_passes(tmp_path):
    from safetensors.torch import save_file

    (tmp_path / "inner").mkdir()
    weights = tmp_path / "inner" / "model.safetensors"
    save_file({"w": torch.ones(64, 64)}, weights)
    (tmp_path / "config.json").write_text('{"a": 1}')
    check_saved_files(tmp_path)
    whole = weights.read_bytes()
    for damaged in (whole[:-16], b"not safetensors"):  # cut short, or not one at all
        weights.write_bytes(damaged)
        with pytest.raises(ValueError, match=r"inner/model.safetensors: not a readable safetensors file \("):
            check_saved_files(tmp_path)
    weights.write_bytes(whole)
    (tmp_path / "inner" / "tokenizer.json").write_text('{"model": ')
    with pytest.raises(ValueError, match="inner/tokenizer.json: not valid JSON at line 1, column 11"):
        check_saved_files(tmp_path)
