"""lm-eval model `tlt`: generation tasks decoded by tlt's native engine, with speculative decoding on or off.

    from tlt.eval.lm import register_tlt_model
    TltLM = register_tlt_model()  # imports lm-eval, registers the class as "tlt"
    lm = TltLM.create_from_arg_string("pretrained=runs/m/model,drafter=ngram,sd=on,strategy=4_1_5")
    lm_eval.simple_evaluate(model=lm, tasks=[...])
    lm.records  # one GenerationRecord per request: token ids and text, to compare SD on vs off

Model args: pretrained=FOLDER, drafter=FOLDER|ngram|none, sd=on|off, strategy=STEPS_TOPK_VERIFY,
max_new_tokens=N (an upper bound; a request's max_gen_toks may lower it), batch_size=N, seed=N, device=cpu.
SD on drafts with `strategy` on every decode step (a FixedTuner whose threshold is the batch size). Only
generate_until is served: the native engine returns no prompt log-likelihoods. lm-eval is imported only when
the class is built, so this module imports without it.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

INSTALL_HINT = "the lm-eval harness is not installed; install it with: pip install 'tlt[eval]'"
_GEN_KWARGS = {"until", "do_sample", "temperature", "top_p", "top_k", "max_gen_toks"}


@dataclass(frozen=True)
class TltModelArgs:
    """The `tlt` model args; strings as lm-eval passes them are converted and checked here."""

    pretrained: str  # HF model folder (tlt bootstrap / train output)
    drafter: str = "ngram"  # saved drafter folder, "ngram" (prompt lookup) or "none"
    sd: str = "on"  # "on": speculative decoding on every step; "off": plain decoding
    strategy: str = "4_1_5"  # SD strategy steps_topk_verifytokens
    max_new_tokens: int = 256
    batch_size: int = 8
    seed: int = 0  # seeds sampling when a task asks for temperature > 0
    device: str = "cpu"

    def __post_init__(self) -> None:
        from tlt.speculative.strategy import SpecStrategy

        for name in ("max_new_tokens", "batch_size", "seed"):
            value = getattr(self, name)
            try:
                object.__setattr__(self, name, int(value))
            except (TypeError, ValueError):
                raise ValueError(f"tlt model arg {name} must be an integer, got {value!r}") from None
        if self.max_new_tokens < 1 or self.batch_size < 1:
            raise ValueError(
                f"max_new_tokens and batch_size must be >= 1, got {self.max_new_tokens}, {self.batch_size}"
            )
        if self.sd not in ("on", "off"):
            raise ValueError(f"tlt model arg sd must be 'on' or 'off', got {self.sd!r}")
        if self.sd == "on" and self.drafter == "none":
            raise ValueError("sd=on needs a drafter: drafter=ngram or drafter=<saved drafter folder>")
        SpecStrategy.parse(self.strategy)

    @classmethod
    def from_kwargs(cls, kwargs: Mapping[str, Any]) -> TltModelArgs:
        """From lm-eval's keyword arguments: unknown names raise; batch/device extras of lm-eval are read."""
        names = {f.name for f in fields(cls)}
        extra = dict(kwargs)
        extra.pop("max_batch_size", None)  # lm-eval passes it to every model; batches here are fixed
        if extra.get("device") is None:
            extra.pop("device", None)
        unknown = sorted(set(extra) - names)
        if unknown:
            raise ValueError(f"unknown tlt model arg(s) {unknown}; accepted: {', '.join(sorted(names))}")
        if "pretrained" not in extra:
            raise ValueError("the tlt model needs pretrained=<HF model folder>")
        return cls(**{k: _as_text(v) if k in _TEXT_ARGS else v for k, v in extra.items()})


_TEXT_ARGS = ("pretrained", "drafter", "sd", "strategy", "device")


def _as_text(value: Any) -> str:
    """A text model arg from a typed value (lm-eval's dict args): None -> "none", True/False -> "on"/"off"."""
    if isinstance(value, bool):
        return "on" if value else "off"
    return "none" if value is None else str(value)


@dataclass
class GenerationRecord:
    """One served request: what the engine produced for a prompt."""

    task: str | None
    doc_id: int | None
    token_ids: list[int]  # [T] response token ids, EOS included when produced
    text: str  # decoded response, cut before the first stop string
    finish_reason: str  # "stop" (EOS) or "length"


@dataclass
class DecodeTotals:
    """Decode steps summed over every batch served (engine step stats): did SD run, and how well."""

    steps: int = 0
    sd_steps: int = 0
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    generated_tokens: int = 0

    def add(self, step_stats) -> None:
        for s in step_stats:
            self.steps += 1
            self.sd_steps += int(s.sd_on)
            self.drafted_tokens += s.drafted_tokens
            self.accepted_tokens += s.accepted_tokens
            self.generated_tokens += s.generated_tokens


@dataclass(frozen=True)
class GenerationSettings:
    """A request's gen_kwargs, resolved: requests sharing settings are decoded in the same batches."""

    until: tuple[str, ...] = ()
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 256

    @classmethod
    def of(cls, gen_kwargs: Mapping[str, Any], max_new_tokens: int) -> GenerationSettings:
        unsupported = sorted(set(gen_kwargs) - _GEN_KWARGS)
        if unsupported:
            raise ValueError(f"tlt model: unsupported gen_kwargs {unsupported}; supported: {sorted(_GEN_KWARGS)}")
        until = gen_kwargs.get("until") or ()
        sample = gen_kwargs.get("do_sample", False)
        return cls(
            until=(until,) if isinstance(until, str) else tuple(until),
            temperature=float(gen_kwargs.get("temperature", 1.0)) if sample else 0.0,
            top_p=float(gen_kwargs.get("top_p", 1.0)),
            top_k=int(gen_kwargs.get("top_k", 0)),
            max_new_tokens=min(int(gen_kwargs.get("max_gen_toks", max_new_tokens)), max_new_tokens),
        )


def cut_at_stop(text: str, until: Sequence[str]) -> str:
    """`text` up to the earliest stop string (lm-eval's `until`), all of it when none occurs."""
    cuts = [i for i in (text.find(s) for s in until if s) if i >= 0]
    return text[: min(cuts)] if cuts else text


@dataclass
class TltGenerator:
    """The model, tokenizer and drafter behind the `tlt` lm-eval model; decodes batches of prompts."""

    args: TltModelArgs
    model: Any = field(init=False)  # HF causal LM, float32, eval mode
    tokenizer: Any = field(init=False)
    drafter: Any = field(init=False)  # tlt Drafter, None with sd=off
    totals: DecodeTotals = field(init=False, default_factory=DecodeTotals)

    def __post_init__(self) -> None:
        from tlt.drafters import drafter_from_spec
        from tlt.models.io import load_hf_folder

        self.model, self.tokenizer = load_hf_folder(self.args.pretrained)
        self.drafter = None if self.args.sd == "off" else drafter_from_spec(self.args.drafter)

    def generate(self, prompts: Sequence[str], settings: GenerationSettings) -> list[GenerationRecord]:
        """Records (task and doc_id unset) for `prompts`, decoded `batch_size` at a time with `settings`."""
        from tlt.backends.base import SamplingParams
        from tlt.backends.native import NativeEngine
        from tlt.schedulers.tuners import FixedTuner

        ids = [self.tokenizer.encode(p) for p in prompts]
        limit = self.model.config.max_position_embeddings
        tuner = None if self.drafter is None else FixedTuner(self.args.strategy, threshold=self.args.batch_size)
        engine = NativeEngine(
            self.model,
            self.tokenizer.eos_token_id,
            max_seq_len=min(max(map(len, ids)) + settings.max_new_tokens, limit),
            tuner=tuner,
            drafter=self.drafter,
            device=self.args.device,
            truncate_prompts="left",
        )
        records = []
        for num, start in enumerate(range(0, len(ids), self.args.batch_size)):
            params = SamplingParams(
                settings.temperature,
                settings.top_p,
                settings.top_k,
                settings.max_new_tokens,
                seed=self.args.seed + num,
            )
            rollouts = engine.generate(ids[start : start + self.args.batch_size], params)
            self.totals.add(engine.step_stats)
            for rollout in rollouts:
                tokens = rollout.token_ids.tolist()
                text = cut_at_stop(self.tokenizer.decode(tokens, skip_special_tokens=True), settings.until)
                records.append(GenerationRecord(None, None, tokens, text, rollout.finish_reason.value))
        return records


def require_lm_eval() -> None:
    """Import lm-eval or raise ImportError with the install hint."""
    try:
        import lm_eval  # noqa: F401
    except ImportError as err:
        raise ImportError(INSTALL_HINT) from err


@functools.cache
def register_tlt_model() -> type:
    """Import lm-eval, register the `tlt` model class with it (once) and return the class."""
    require_lm_eval()
    import lm_eval.models  # noqa: F401  built-ins first: lm-eval fills an empty registry lazily, not a non-empty one
    from lm_eval.api.model import LM
    from lm_eval.api.registry import register_model

    @register_model("tlt")
    class TltLM(LM):
        """lm-eval model over `TltGenerator`; `records` keeps every served request in arrival order."""

        def __init__(self, **kwargs: Any) -> None:
            super().__init__()
            self.args = TltModelArgs.from_kwargs(kwargs)
            self.generator = TltGenerator(self.args)
            self.records: list[GenerationRecord] = []

        @classmethod
        def create_from_arg_string(cls, arg_string: str, additional_config: dict | None = None) -> TltLM:
            """Like lm-eval's, but values stay strings: its type guessing reads strategy=4_1_5 as 415.0."""
            return cls.create_from_arg_obj(parse_model_args(arg_string), additional_config)

        @classmethod
        def create_from_arg_obj(cls, arg_dict: dict, additional_config: dict | None = None) -> TltLM:
            """Model args win over lm-eval's extras (its CLI always passes batch_size, 1 by default)."""
            extras = {k: v for k, v in (additional_config or {}).items() if v is not None}
            return cls(**{**extras, **arg_dict})

        def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
            return serve(self.generator, requests, self.records, self.cache_hook)

        def loglikelihood(self, requests, disable_tqdm: bool = False):
            raise NotImplementedError(_NO_LOGLIKELIHOOD)

        def loglikelihood_rolling(self, requests, disable_tqdm: bool = False):
            raise NotImplementedError(_NO_LOGLIKELIHOOD)

    return TltLM


_NO_LOGLIKELIHOOD = (
    "the tlt lm-eval model serves generation tasks only (output_type: generate_until); "
    "loglikelihood and multiple-choice tasks need lm-eval's hf model"
)


def parse_model_args(arg_string: str) -> dict[str, str]:
    """ "k=v,k=v" -> {k: v} with string values; a pair without "=" or a repeated key raises."""
    out: dict[str, str] = {}
    for pair in filter(None, (p.strip() for p in (arg_string or "").split(","))):
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"tlt model args: expected key=value, got {pair!r} in {arg_string!r}")
        if key.strip() in out:
            raise ValueError(f"tlt model args: {key.strip()!r} given twice in {arg_string!r}")
        out[key.strip()] = value.strip()
    return out


def serve(generator: TltGenerator, requests, records: list[GenerationRecord], cache_hook=None) -> list[str]:
    """Answer lm-eval generate_until `requests` (Instances); append one record per request to `records`."""
    groups: dict[GenerationSettings, list[int]] = {}
    for i, request in enumerate(requests):
        settings = GenerationSettings.of(request.args[1], generator.args.max_new_tokens)
        groups.setdefault(settings, []).append(i)
    served: list[GenerationRecord | None] = [None] * len(requests)
    for settings, rows in groups.items():
        for i, record in zip(rows, generator.generate([requests[i].args[0] for i in rows], settings), strict=True):
            served[i] = replace(record, task=requests[i].task_name, doc_id=requests[i].doc_id)
            if cache_hook is not None:
                cache_hook.add_partial("generate_until", requests[i].args, record.text)
    records.extend(served)
    return [r.text for r in served]


def __getattr__(name: str):
    if name == "TltLM":  # `from tlt.eval.lm import TltLM` builds (and registers) the class on demand
        return register_tlt_model()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
