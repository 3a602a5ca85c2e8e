"""The trained assets shipped with tlt (`tlt.assets`): each matches its card file for file, loads as the card
says, scores the card's held-out accuracy within tolerance, and its drafter is accepted as the card says; a
damaged asset fails with the file named; configs reach assets through the `${asset:...}` resolver."""

import json
import shutil

import pytest
import torch

from tlt import assets
from tlt.assets.build import drafter_acceptance, heldout_report
from tlt.config import ConfigError, load_config
from tlt.models.io import load_hf_folder
from tlt.models.presets import count_parameters, preset_from_name

NAMES = assets.names()
MAX_BYTES = 40 * 2**20  # an asset is small enough to live in the repository


def test_the_main_job_has_its_asset():
    assert "deep_v2" in NAMES
    cfg = load_config("configs/quickstart.yaml")
    assert cfg.model.path == assets.asset_path("deep_v2/policy")
    assert cfg.drafter.path == assets.asset_path("deep_v2/drafter")


@pytest.mark.parametrize("name", NAMES)
def test_asset_matches_its_card(name):
    card = assets.verify(name)
    folder = assets.ROOT / name
    assert sum((folder / rel).stat().st_size for rel in card["files"]) <= MAX_BYTES
    assert {"commands", "seed", "data", "bootstrap", "heldout", "drafter_check", "machine"} <= card.keys()
    model, tokenizer = load_hf_folder(folder / "policy")
    assert all(p.dtype == torch.float32 for p in model.parameters())  # stored in bf16, loaded as float32
    assert count_parameters(model) == card["parameters"]
    preset = preset_from_name(card["preset"])
    assert (model.config.num_hidden_layers, model.config.hidden_size) == (preset.num_layers, preset.hidden_size)
    assert tokenizer.vocab_size == model.config.vocab_size


@pytest.mark.parametrize("name", NAMES)
def test_asset_scores_its_card(name):
    """Greedy accuracy on the card's quick held-out set within 3 problems of the card (float32 kernels differ
    between CPUs, so a near tie may flip), and the drafter accepted as the card says (within 0.25)."""
    card = assets.verify(name)
    folder = assets.ROOT / name
    quick = card["heldout"]["quick"]
    report = heldout_report(
        folder / "policy", card["data"], quick["num_problems"], card["heldout"]["greedy_max_new_tokens"]
    )
    assert abs(report.accuracy - quick["accuracy"]) * quick["num_problems"] <= 3
    check = card["drafter_check"]
    accept = drafter_acceptance(folder / "policy", folder / "drafter", card["data"], check["prompts"], 256)
    assert accept >= check["accept_length"] - 0.25 and accept > 2.0


def _copy(name: str, tmp_path, monkeypatch):
    root = tmp_path / "assets"
    shutil.copytree(assets.ROOT / name, root / name)
    monkeypatch.setattr(assets, "ROOT", root)
    assets.verify.cache_clear()
    return root / name


@pytest.mark.parametrize("name", NAMES[:1])
def test_a_damaged_asset_fails_naming_the_file(name, tmp_path, monkeypatch):
    folder = _copy(name, tmp_path, monkeypatch)
    try:
        weights = folder / "policy" / "model.safetensors"
        data = bytearray(weights.read_bytes())
        data[-1] ^= 0xFF
        weights.write_bytes(bytes(data))
        with pytest.raises(assets.AssetError, match="policy/model.safetensors does not match its card"):
            assets.verify(name)
        with pytest.raises(ConfigError, match=r"config key 'model.path'.*does not match its card"):
            load_config(None, [f"model.path=${{asset:{name}/policy}}"])
        assets.verify.cache_clear()
        (folder / "policy" / "extra.bin").write_bytes(b"x")
        weights.unlink()
        with pytest.raises(assets.AssetError, match=r"missing files \['policy/model.safetensors'\], unexpected "):
            assets.verify(name)
    finally:
        assets.verify.cache_clear()


def test_unknown_assets_and_folders_are_clear_errors():
    with pytest.raises(ConfigError, match="model.path.*no tlt asset named 'nope'; installed: "):
        load_config(None, ["model.path=${asset:nope/policy}"])
    if NAMES:
        with pytest.raises(assets.AssetError, match="has no folder 'weights'"):
            assets.asset_path(f"{NAMES[0]}/weights")


def test_card_is_json_with_a_sha256_per_file():
    for name in NAMES:
        card = json.loads((assets.ROOT / name / assets.CARD).read_text())
        assert all(len(digest) == 64 for digest in card["files"].values())
