"""The lm-eval model `tlt`: model args, gen_kwargs, request bookkeeping and the generation-only contract."""

import sys

import pytest
from lm_eval.api.instance import Instance

from tests.tiny_model import save_tiny_model
from tlt.eval.lm import (
    GenerationSettings,
    TltModelArgs,
    cut_at_stop,
    parse_model_args,
    register_tlt_model,
    require_lm_eval,
)


@pytest.fixture(scope="module")
def tiny_lm(tmp_path_factory):
    folder = save_tiny_model(tmp_path_factory.mktemp("lm") / "model")
    return register_tlt_model().create_from_arg_string(
        f"pretrained={folder},sd=on,strategy=3_1_4,max_new_tokens=6,batch_size=2"
    )


def _request(prompt: str, doc_id: int, gen_kwargs: dict) -> Instance:
    return Instance("generate_until", {}, (prompt, gen_kwargs), idx=0, metadata=("t", doc_id, 1))


def test_model_args_stay_strings_where_lm_eval_would_guess_numbers():
    assert parse_model_args("pretrained=/m,strategy=4_1_5,drafter=none,sd=off") == {
        "pretrained": "/m",
        "strategy": "4_1_5",
        "drafter": "none",
        "sd": "off",
    }
    args = TltModelArgs.from_kwargs(
        {
            **parse_model_args("pretrained=/m,max_new_tokens=16"),
            "batch_size": 4,
            "max_batch_size": None,
            "device": None,
        }
    )
    assert (args.strategy, args.max_new_tokens, args.batch_size, args.device) == ("4_1_5", 16, 4, "cpu")


@pytest.mark.parametrize(
    ("arg_string", "message"),
    [
        ("pretrained=/m,temperature=0.5", r"unknown tlt model arg\(s\) \['temperature'\]; accepted: "),
        ("drafter=ngram", "needs pretrained="),
        ("pretrained=/m,sd=maybe", "sd must be 'on' or 'off'"),
        ("pretrained=/m,sd=on,drafter=none", "sd=on needs a drafter"),
        ("pretrained=/m,strategy=4-1-5", "invalid SD strategy"),
        ("pretrained=/m,batch_size=big", "batch_size must be an integer"),
        ("pretrained=/m,pretrained=/n", "given twice"),
        ("pretrained", "expected key=value"),
    ],
)
def test_bad_model_args_fail_before_loading_anything(arg_string, message):
    with pytest.raises(ValueError, match=message):
        register_tlt_model().create_from_arg_string(arg_string)


def test_model_args_win_over_lm_eval_extras(tiny_lm):
    lm = register_tlt_model().create_from_arg_string(
        f"pretrained={tiny_lm.args.pretrained},sd=off,drafter=none,batch_size=3",
        {"batch_size": 1, "max_batch_size": None, "device": "cpu"},
    )
    assert (lm.args.batch_size, lm.args.sd, lm.generator.drafter) == (3, "off", None)


def test_registered_as_tlt_next_to_lm_evals_own_models():
    from lm_eval.api.registry import get_model, model_registry

    tlt_lm = register_tlt_model()
    assert get_model("tlt") is tlt_lm and register_tlt_model() is tlt_lm
    assert {"hf", "vllm"} <= set(model_registry.keys())  # still known (materialising hf needs accelerate)


def test_missing_lm_eval_gives_the_install_hint(monkeypatch):
    monkeypatch.setitem(sys.modules, "lm_eval", None)
    with pytest.raises(ImportError, match=r"pip install 'tlt\[eval\]'"):
        require_lm_eval()


def test_gen_kwargs_resolve_to_greedy_or_sampling_with_a_capped_budget():
    assert GenerationSettings.of({"until": "\n\n", "do_sample": False, "temperature": 0.7}, 32) == GenerationSettings(
        ("\n\n",), 0.0, 1.0, 0, 32
    )
    sampled = GenerationSettings.of({"do_sample": True, "temperature": 0.7, "max_gen_toks": 100}, 32)
    assert (sampled.temperature, sampled.max_new_tokens) == (0.7, 32)
    with pytest.raises(ValueError, match=r"unsupported gen_kwargs \['repetition_penalty'\]"):
        GenerationSettings.of({"repetition_penalty": 1.1}, 32)


def test_cut_at_stop_uses_the_earliest_stop_string():
    assert cut_at_stop("a\nb</s>c\n\nd", ["\n\n", "</s>"]) == "a\nb"
    assert cut_at_stop("abc", []) == "abc"


def test_generate_until_records_every_request_in_order(tiny_lm):
    requests = [_request("Question: 1 + 2?\nSolution:\n", i, {"until": [], "do_sample": False}) for i in range(3)]
    requests.append(_request("Question: 3?\n", 3, {"until": ["\n"], "do_sample": True, "temperature": 1.0}))
    texts = tiny_lm.generate_until(requests)
    assert len(texts) == len(tiny_lm.records) == 4
    assert [(r.task, r.doc_id) for r in tiny_lm.records] == [("t", 0), ("t", 1), ("t", 2), ("t", 3)]
    assert all(1 <= len(r.token_ids) <= 6 for r in tiny_lm.records)
    assert tiny_lm.records[0].token_ids == tiny_lm.records[2].token_ids  # same prompt, greedy
    assert "\n" not in texts[3] and texts[0] == tiny_lm.records[0].text
    assert tiny_lm.generator.totals.sd_steps > 0


def test_loglikelihood_is_refused_with_a_clear_message(tiny_lm):
    with pytest.raises(NotImplementedError, match="generation tasks only"):
        tiny_lm.loglikelihood([])
    with pytest.raises(NotImplementedError, match="generate_until"):
        tiny_lm.loglikelihood_rolling([])
