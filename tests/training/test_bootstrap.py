"""`tlt bootstrap` end to end on a few steps: the folder loads in transformers, the card is complete, the run
is deterministic for a seed, and the test preset learns (held-out response loss falls far below chance)."""

import json

import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, AutoTokenizer

from tlt.config import load_config
from tlt.data.prompts import format_prompt, format_response
from tlt.data.splits import heldout_problems, task_mix
from tlt.models.presets import BOOTSTRAP_DEFAULTS
from tlt.training.bootstrap import run_bootstrap
from tlt.training.sft import collate, encode_examples

FAST = [
    "data.train_size=600",
    "data.heldout_size=16",
    "eval.max_new_tokens=48",
    "bootstrap.checkpoint_every=20",
]


def _cfg(out, steps):
    overrides = [f"output_dir={out}", "model.preset=test", f"bootstrap.max_steps={steps}", *FAST]
    return load_config(None, overrides, BOOTSTRAP_DEFAULTS["test"])


def _heldout_loss(model, tokenizer, cfg) -> float:
    problems = heldout_problems(task_mix(cfg.data), 16, seed=1)
    examples = encode_examples(
        [format_prompt(p.question) for p in problems],
        [format_response(p.solution) for p in problems],
        tokenizer,
        384,
    )
    batch = collate(examples, tokenizer.pad_token_id)
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    return F.cross_entropy(logits[:, :-1].flatten(0, 1), batch["labels"][:, 1:].flatten(), ignore_index=-100).item()


def test_bootstrap_writes_a_loadable_model_and_card_and_learns(tmp_path):
    cfg = _cfg(tmp_path / "a", steps=60)
    card = run_bootstrap(cfg)
    folder = tmp_path / "a" / "model"
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert json.loads((tmp_path / "a" / "card.json").read_text()) == card
    assert card["preset"] == "test" and card["heldout"]["num_problems"] == 16
    assert set(card["heldout"]["response_tokens"]) == {"p50", "p90", "p99", "max", "mean"}
    untrained = AutoModelForCausalLM.from_config(model.config).eval()
    trained_loss, chance_loss = _heldout_loss(model, tokenizer, cfg), _heldout_loss(untrained, tokenizer, cfg)
    assert chance_loss > 5.0  # ~log(vocab)
    assert trained_loss < 0.4 * chance_loss, (trained_loss, chance_loss)


def test_bootstrap_is_deterministic_and_resumes(tmp_path):
    first = run_bootstrap(_cfg(tmp_path / "a", steps=20))
    second = run_bootstrap(_cfg(tmp_path / "b", steps=20))
    a = AutoModelForCausalLM.from_pretrained(tmp_path / "a" / "model").state_dict()
    b = AutoModelForCausalLM.from_pretrained(tmp_path / "b" / "model").state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert first["heldout"]["accuracy"] == second["heldout"]["accuracy"]
    # resuming a finished 20-step run to 30 steps continues from its last checkpoint
    resumed = run_bootstrap(_cfg(tmp_path / "a", steps=30))
    assert (tmp_path / "a" / "checkpoints" / "last.ckpt").is_file()
    assert resumed["bootstrap"]["max_steps"] == 30
