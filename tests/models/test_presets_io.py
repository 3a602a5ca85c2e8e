import pytest
import torch
from transformers import AutoModelForCausalLM

from tlt.files import atomic_save_figure
from tlt.models.io import load_hf_folder, save_hf_folder
from tlt.models.presets import PRESETS, build_model, count_parameters, preset_from_name
from tlt.models.tokenizer import train_tokenizer

SIZES = [("test", 0.5e6, 1.5e6), ("tiny", 3e6, 7e6), ("small", 15e6, 20e6), ("deep", 10e6, 15e6)]


@pytest.mark.parametrize(("name", "low", "high"), SIZES)
def test_preset_sizes(name, low, high):
    assert low <= count_parameters(build_model(name, vocab_size=1024)) <= high


def test_build_is_deterministic_for_a_seed():
    a, b, c = (
        build_model("test", 300, seed=1),
        build_model("test", 300, seed=1),
        build_model("test", 300, seed=2),
    )
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=False))
    assert not torch.equal(a.model.embed_tokens.weight, c.model.embed_tokens.weight)


def test_unknown_preset():
    with pytest.raises(ValueError, match="available: deep, small, test, tiny"):
        preset_from_name("huge")
    assert set(PRESETS) >= {"test", "tiny", "small", "deep"}


def test_save_load_round_trip_equal_logits(tmp_path):
    tok = train_tokenizer(["1 + 2 = 3\n"] * 10, vocab_size=300)
    model = build_model("test", len(tok), seed=3)
    save_hf_folder(model, tok, tmp_path / "m")
    save_hf_folder(model, tok, tmp_path / "m")  # overwriting an existing folder is atomic too
    loaded, tok2 = load_hf_folder(tmp_path / "m")
    auto = AutoModelForCausalLM.from_pretrained(tmp_path / "m")
    x = torch.tensor([tok.encode("12 + 30 = 42")])
    with torch.no_grad():
        ref = model(x).logits
        assert torch.equal(loaded(x).logits, ref)
        assert torch.equal(auto(x).logits, ref)
    assert tok2.encode("7 + 8") == tok.encode("7 + 8")
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_load_missing_folder_is_clear(tmp_path):
    with pytest.raises(FileNotFoundError, match="model folder not found"):
        load_hf_folder(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no config.json"):
        load_hf_folder(tmp_path / "empty")


def test_atomic_save_figure_writes_a_png_or_keeps_the_old_file(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = tmp_path / "plots" / "fig.png"
    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0])
    atomic_save_figure(fig, path, dpi=50)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and not plt.fignum_exists(fig.number)
    before = path.read_bytes()
    broken, _ = plt.subplots()
    broken.savefig = lambda *a, **k: (_ for _ in ()).throw(OSError("disk full"))
    with pytest.raises(OSError, match="disk full"):
        atomic_save_figure(broken, path)
    assert path.read_bytes() == before and sorted(p.name for p in path.parent.iterdir()) == ["fig.png"]
