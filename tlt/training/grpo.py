"""GRPO for the policy: group-normalised advantages, the clipped surrogate, k3 KL, entropy bonus, one module.

The math is small pure functions on [B, T] tensors (T: the target axis, token t + 1 predicted at position t);
`GRPOModule` composes them and states the exact variant. Log-probs are taken at the sampling temperature,
log_softmax(logits / temperature), the distribution the engine sampled from (`Rollout.logprobs`).
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Callable
from dataclasses import dataclass

import lightning as L
import torch
import torch.nn.functional as F
from torch.distributed.tensor import DTensor
from torch.utils.checkpoint import checkpoint

from tlt.config import GRPOConfig
from tlt.machine import resolve_precision

ADVANTAGE_EPS = 1e-4  # added to the group std, as in TRL's GRPOTrainer


# ---- the math ------------------------------------------------------------------------------------------


def group_advantages(
    rewards: torch.Tensor, group_size: int, scale: bool = True, eps: float = ADVANTAGE_EPS
) -> torch.Tensor:
    """Per-sample advantages from rewards [B] laid out as B / G consecutive groups of G samples -> [B].

    A_i = (r_i - mean_g) / (std_g + eps) with std_g the *sample* standard deviation of the group (n - 1
    denominator, torch.std, as TRL's GRPOTrainer); scale=False gives r_i - mean_g (Dr. GRPO). A group whose
    rewards are all equal (including G = 1) gets exactly 0: it carries no signal.
    """
    if rewards.dim() != 1 or group_size < 1 or rewards.numel() % group_size:
        raise ValueError(
            f"group_advantages needs rewards [B] with B a multiple of group_size={group_size}; "
            f"got shape {tuple(rewards.shape)}"
        )
    r = rewards.float().view(-1, group_size)  # [B / G, G]
    centred = r - r.mean(dim=1, keepdim=True)  # [B / G, G]
    if scale and group_size > 1:
        centred = centred / (r.std(dim=1, keepdim=True) + eps)
    same = (r == r[:, :1]).all(dim=1, keepdim=True)  # [B / G, 1]
    return torch.where(same, 0.0, centred).view(-1)


def clipped_surrogate(
    logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, clip_eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token clipped policy loss -min(rho A, clip(rho, 1 - eps, 1 + eps) A), rho = pi / pi_old.

    logprobs, old_logprobs: [B, T]; advantages: [B], one per sequence (outcome reward), broadcast over its
    tokens. Returns (loss [B, T], clipped [B, T] bool). `clipped` marks tokens where the clipped term is
    strictly the smaller objective, i.e. rho > 1 + eps with A > 0 or rho < 1 - eps with A < 0: their gradient
    is zero. (rho < 1 - eps with A > 0, or rho > 1 + eps with A < 0, is not clipped: the pessimistic bound.)
    """
    ratio = torch.exp(logprobs - old_logprobs)  # [B, T]
    adv = advantages[:, None].to(ratio.dtype)  # [B, 1]
    unclipped = ratio * adv  # [B, T]
    clipped = ratio.clamp(1 - clip_eps, 1 + clip_eps) * adv  # [B, T]
    return -torch.minimum(unclipped, clipped), clipped < unclipped


def kl_k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(pi || pi_ref) at sampled tokens: exp(d) - d - 1, d = log pi_ref - log pi.

    [B, T] -> [B, T], always >= 0; DeepSeekMath eq. 4 (pi_ref / pi - log(pi_ref / pi) - 1), from Schulman's
    "Approximating KL divergence" (http://joschu.net/blog/kl-approx.html).
    """
    d = ref_logprobs - logprobs  # [B, T]
    return torch.exp(d) - d - 1


def token_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of values [B, T] over mask [B, T] positions: every response token of the batch weighs the same
    (DAPO's token-level mean, not a mean of per-sequence means). 0 for an empty mask."""
    mask = mask.to(values.dtype)
    return (values * mask).sum() / mask.sum().clamp(min=1)


# ---- records -------------------------------------------------------------------------------------------


@dataclass
class PolicyOutput:
    logprobs: torch.Tensor  # [B, T - 1] log pi(x_{t+1} | x_<=t) at the sampling temperature
    entropy: torch.Tensor | None  # [B, T - 1] entropy of that tempered next-token distribution (if asked)
    hidden: torch.Tensor  # [B, T, D] last-layer state after the final norm, at every position


@dataclass
class GRPOBatch:
    """One step's rollouts laid out for the policy forward: prompt + response, right-padded."""

    input_ids: torch.Tensor  # [B, T] int64
    attention_mask: torch.Tensor  # [B, T] bool, real (non-padding) tokens
    response_mask: torch.Tensor  # [B, T] bool, response tokens
    advantages: torch.Tensor  # [B] float32
    old_logprobs: torch.Tensor | None = None  # [B, T - 1] of input_ids[:, 1:], policy before the update
    ref_logprobs: torch.Tensor | None = None  # [B, T - 1] the same under the frozen reference (KL on)
    sampler_logprobs: torch.Tensor | None = None  # [B, T - 1] the engine's log-probs (diagnostics only)

    @property
    def loss_mask(self) -> torch.Tensor:
        """[B, T - 1] bool: the predicted token is a response token."""
        return self.response_mask[:, 1:]

    @property
    def size(self) -> int:
        return self.input_ids.shape[0]

    def to(self, device: torch.device | str) -> GRPOBatch:
        moved = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return GRPOBatch(**{k: None if v is None else v.to(device) for k, v in moved.items()})

    def rows(self, index: torch.Tensor) -> GRPOBatch:
        """The sub-batch of rows `index` ([b] int64), trimmed to its longest sequence."""
        T = int(self.attention_mask[index].sum(1).max())

        def take(x: torch.Tensor | None, length: int) -> torch.Tensor | None:
            return None if x is None else x[index, :length]

        return GRPOBatch(
            self.input_ids[index, :T],
            self.attention_mask[index, :T],
            self.response_mask[index, :T],
            self.advantages[index],
            take(self.old_logprobs, T - 1),
            take(self.ref_logprobs, T - 1),
            take(self.sampler_logprobs, T - 1),
        )


def make_batch(
    prompts: list[torch.Tensor],
    responses: list[torch.Tensor],
    advantages: torch.Tensor,
    pad_id: int,
    sampler_logprobs: list[torch.Tensor] | None = None,
) -> GRPOBatch:
    """Right-pad prompt [P_b] + response [R_b] rows into a GRPOBatch (sampler log-probs [R_b] per row)."""
    B = len(prompts)
    lengths = [p.numel() + r.numel() for p, r in zip(prompts, responses, strict=True)]
    T = max(lengths)
    input_ids = torch.full((B, T), pad_id, dtype=torch.long)  # [B, T]
    attention = torch.zeros(B, T, dtype=torch.bool)  # [B, T]
    response = torch.zeros(B, T, dtype=torch.bool)  # [B, T]
    sampled = torch.zeros(B, T - 1) if sampler_logprobs is not None else None  # [B, T - 1]
    for b, (p, r) in enumerate(zip(prompts, responses, strict=True)):
        P, n = p.numel(), lengths[b]
        input_ids[b, :n] = torch.cat([p.cpu(), r.cpu()])
        attention[b, :n] = True
        response[b, P:n] = True
        if sampled is not None:
            sampled[b, P - 1 : n - 1] = sampler_logprobs[b].float().cpu()  # position t predicts token t + 1
    return GRPOBatch(input_ids, attention, response, advantages.float().cpu(), sampler_logprobs=sampled)


def hidden_and_logits(
    model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(post-norm hidden states [B, T, D], logits of positions 0 .. T - 2 [B, T - 1, V]) of an HF causal LM."""
    hidden = model.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state
    return hidden, model.get_output_embeddings()(hidden[:, :-1])


def decoder_layers(lm: torch.nn.Module) -> list[torch.nn.Module]:
    """An HF causal LM's decoder layers: the modules of the classes it names in `_no_split_modules` (Qwen2 /
    Llama: their decoder layer)."""
    names = set(getattr(lm, "_no_split_modules", None) or ())
    layers = [m for m in lm.modules() if any(c.__name__ in names for c in type(m).__mro__)]  # FSDP subclasses too
    if not layers:
        raise ValueError(f"{type(lm).__name__} names no decoder layer class in _no_split_modules")
    return layers


def checkpoint_activations(lm: torch.nn.Module) -> None:
    """Make each decoder layer of `lm` recompute its activations in the backward (torch.utils.checkpoint,
    non-reentrant) instead of keeping them from the forward; without gradients it runs as before. Parameter
    names, outputs and gradients stay the same. The layer's `forward` is replaced by a method bound to it, so a
    deep copy of `lm` (the engine's, a reference) runs its own weights. Module hooks (FSDP's) stay outside
    the checkpointed region."""
    for layer in decoder_layers(lm):
        if not isinstance(layer.forward, types.MethodType) or layer.forward.__func__ is not _checkpointed_forward:
            layer.forward = types.MethodType(_checkpointed_forward, layer)


def _checkpointed_forward(layer: torch.nn.Module, *args, **kwargs):
    forward = type(layer).forward
    if not torch.is_grad_enabled():
        return forward(layer, *args, **kwargs)
    return checkpoint(forward, layer, *args, use_reentrant=False, **kwargs)


class HiddenAndLogits(torch.nn.Module):
    """`hidden_and_logits` of `lm` as one module call. FSDP gathers a module's parameters in its forward, and
    `policy_forward` calls the decoder and the LM head apart, so a sharded policy wraps its LM in this
    (`tlt.training.distributed.fsdp`)."""

    def __init__(self, lm: torch.nn.Module):
        super().__init__()
        self.lm = lm

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return hidden_and_logits(self.lm, input_ids, attention_mask)


def policy_forward(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    temperature: float,
    with_entropy: bool = False,
    precision: str = "32-true",
) -> PolicyOutput:
    """One forward of an HF Qwen2 / Llama causal LM: tempered log-probs of the given tokens and hidden states.

    The decoder's `last_hidden_state` is taken after the final norm (the feature the EAGLE drafter and the
    native engine use); the LM head is applied to it here, so no layer runs twice. With precision "bf16-mixed"
    the decoder and the LM head run under bf16 autocast; the log-softmax runs in float32 and the hidden states
    come back in the weights' dtype.
    """
    dtype = next(model.parameters()).dtype
    bf16 = resolve_precision(precision, input_ids.device.type) == "bf16-mixed"
    with torch.autocast(input_ids.device.type, dtype=torch.bfloat16, enabled=bf16):
        if isinstance(model, HiddenAndLogits):
            hidden, logits = model(input_ids, attention_mask)
        else:
            hidden, logits = hidden_and_logits(model, input_ids, attention_mask)
    log_probs = F.log_softmax(logits.float() / temperature, dim=-1)  # [B, T - 1, V]
    logprobs = log_probs.gather(-1, input_ids[:, 1:, None]).squeeze(-1)  # [B, T - 1]
    entropy = -(log_probs.exp() * log_probs).sum(-1) if with_entropy else None  # [B, T - 1]
    return PolicyOutput(logprobs, entropy, hidden.to(dtype))


@dataclass
class GRPOLoss:
    loss: torch.Tensor  # [] what is minimised
    policy_loss: torch.Tensor  # [] token-mean clipped surrogate (detached)
    kl: torch.Tensor  # [] token-mean k3 KL to the reference (detached; 0 without one)
    entropy: torch.Tensor  # [] token-mean entropy (detached; 0 unless entropy_coef > 0)
    clip_fraction: torch.Tensor  # [] share of response tokens whose clip binds


# ---- the module ----------------------------------------------------------------------------------------


class GRPOModule(L.LightningModule):
    """The GRPO policy update; a thin LightningModule (loss + optimizer), driven by `update_policy`.

    Variant: GRPO of DeepSeekMath (Shao et al., 2024, https://arxiv.org/abs/2402.03300, sec. 4.1) with
    outcome supervision: G samples per prompt, a scalar reward per sample, the same group-normalised advantage
    on every token of a sample, the PPO clipped surrogate with the per-token ratio pi / pi_old, and KL to a
    frozen reference policy as a k3 loss term (their eq. 4), not a reward penalty. Choices and deviations:

    - Aggregation: token-mean over all response tokens of the (mini)batch (as DAPO, arXiv 2503.14476), not
      the paper's 1/|o_i| mean per sequence then mean over the group, which down-weights long responses.
    - Advantage: (r - mean) / (std + 1e-4) with the sample std (n - 1, as TRL); equal-reward groups get 0.
      `grpo.scale_rewards=false` drops the std division (Dr. GRPO, arXiv 2503.20783).
    - pi_old is recomputed by the trainer with the current policy before the update (`recompute`), not taken
      from the rollout engine; that forward's post-norm hidden states feed the drafter buffer.
    - mu = `grpo.epochs` passes over the step's rollouts in seeded shuffled minibatches of
      `grpo.minibatch_size` sequences, one AdamW step each (constant lr, grad-norm clip `grpo.max_grad_norm`).
      With one epoch and one minibatch the update is on-policy and the clip never binds (rho = 1).
    - KL off by default (`grpo.kl_coef = 0`: no reference model is kept, as DAPO / Dr. GRPO); the reference
      is the initial policy, never refreshed.
    - Optional entropy bonus -`grpo.entropy_coef` * H (full tempered distribution, token-mean), not in
      the paper.
    - Log-probs at the sampling temperature; dropout off (eval mode); no dynamic sampling or overlong
      filtering: zero-advantage groups and truncated responses stay in the batch (and in the token mean).
    - `grpo.activation_checkpointing=true` recomputes each decoder layer in the backward (same gradients, less
      memory; `checkpoint_activations`).
    - `grpo.precision=bf16-mixed` runs the recompute and the update's forwards under bf16 autocast (weights,
      gradients and AdamW state stay float32; log-softmax in float32). pi_old and pi come from the same
      arithmetic, so rho is exactly 1 on the first minibatch either way.
    """

    def __init__(
        self,
        policy: torch.nn.Module,
        cfg: GRPOConfig,
        temperature: float,
        reference: torch.nn.Module | None = None,
    ):
        super().__init__()
        if temperature <= 0:
            raise ValueError(f"GRPO needs sampled rollouts: temperature must be > 0, got {temperature}")
        if cfg.kl_coef > 0 and reference is None:
            raise ValueError(f"grpo.kl_coef={cfg.kl_coef} needs a reference policy; pass `reference`")
        self.policy = policy.eval()
        if cfg.activation_checkpointing:
            checkpoint_activations(policy.lm if isinstance(policy, HiddenAndLogits) else policy)
        self.reference = None if reference is None else reference.eval().requires_grad_(False)
        self.cfg, self.temperature = cfg, temperature

    def forward(self, input_ids, attention_mask, with_entropy: bool = False) -> PolicyOutput:
        return policy_forward(
            self.policy, input_ids, attention_mask, self.temperature, with_entropy, self.cfg.precision
        )

    @torch.no_grad()
    def recompute(self, batch: GRPOBatch) -> tuple[GRPOBatch, torch.Tensor]:
        """(batch with old and reference log-probs filled in, the policy's hidden states [B, T, D])."""
        out = self(batch.input_ids, batch.attention_mask)
        ref = self.reference_logprobs(batch)
        return dataclasses.replace(batch, old_logprobs=out.logprobs, ref_logprobs=ref), out.hidden

    @torch.no_grad()
    def reference_logprobs(self, batch: GRPOBatch) -> torch.Tensor | None:
        """[B, T - 1] log-probs of the frozen reference (None with the KL term off)."""
        if self.cfg.kl_coef == 0:
            return None
        ids, mask = batch.input_ids, batch.attention_mask
        return policy_forward(self.reference, ids, mask, self.temperature, precision=self.cfg.precision).logprobs

    def loss(self, batch: GRPOBatch) -> GRPOLoss:
        """The GRPO loss of a batch whose old (and reference) log-probs are filled in."""
        if batch.old_logprobs is None:
            raise ValueError("GRPOModule.loss needs batch.old_logprobs: call recompute(batch) first")
        cfg, mask = self.cfg, batch.loss_mask
        out = self(batch.input_ids, batch.attention_mask, with_entropy=cfg.entropy_coef > 0)
        pg, clipped = clipped_surrogate(out.logprobs, batch.old_logprobs, batch.advantages, cfg.clip_eps)
        per_token = pg  # [B, T - 1]
        zero = pg.new_zeros(())
        kl = entropy = zero
        if cfg.kl_coef > 0:
            k3 = kl_k3(out.logprobs, batch.ref_logprobs)
            per_token, kl = per_token + cfg.kl_coef * k3, token_mean(k3.detach(), mask)
        if cfg.entropy_coef > 0:
            per_token = per_token - cfg.entropy_coef * out.entropy
            entropy = token_mean(out.entropy.detach(), mask)
        clip_fraction = token_mean(clipped.float(), mask)
        policy_loss = token_mean(pg.detach(), mask)
        return GRPOLoss(token_mean(per_token, mask), policy_loss, kl, entropy, clip_fraction)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.policy.parameters(), lr=self.cfg.lr, weight_decay=self.cfg.weight_decay)


@dataclass
class UpdateStats:
    """Means over the optimizer steps of one policy update."""

    optimizer_steps: int
    loss: float
    policy_loss: float
    kl: float
    entropy: float
    clip_fraction: float
    grad_norm: float  # before clipping


def micro_batches(lengths: torch.Tensor, max_tokens: int, overhead_tokens: int) -> list[torch.Tensor]:
    """Rows sorted longest first and cut into micro-batches of at most `max_tokens` padded tokens (rows x
    longest row) each, at least one row per micro-batch; lengths [B] -> index tensors [b] (on lengths' device).

    Rollout lengths are long-tailed: one 500-token response padded together with fifteen 40-token ones makes a
    forward mostly padding, and so does a token budget filled greedily after a long row. The cuts minimise
    padded tokens + `overhead_tokens` per micro-batch (a forward's fixed cost in token equivalents), exactly,
    by dynamic programming over the sorted rows: a long row gets a micro-batch of its own when the padding it
    would cost its neighbours outweighs one more forward.
    """
    order = torch.argsort(lengths, descending=True, stable=True)
    rows = lengths[order].tolist()  # longest first
    cost = [0.0] + [float("inf")] * len(rows)  # cost[j]: the cheapest cut of the first j sorted rows
    start = [0] * (len(rows) + 1)  # start[j]: where the last micro-batch of that cut begins
    for j in range(1, len(rows) + 1):
        for i in range(j - 1, -1, -1):  # micro-batch = sorted rows i .. j - 1, padded to rows[i]
            if i < j - 1 and (j - i) * rows[i] > max_tokens:
                break  # an earlier start only adds rows and length
            c = cost[i] + (j - i) * rows[i] + overhead_tokens
            if c < cost[j]:
                cost[j], start[j] = c, i
    groups, j = [], len(rows)
    while j > 0:
        groups.append(order[start[j] : j])
        j = start[j]
    return groups[::-1]


def old_logprobs_source(cfg: GRPOConfig, backend: str, device_type: str) -> str:
    """Where pi_old comes from (`grpo.old_logprobs`): "recompute" or "rollout". auto takes the engine's own
    log-probs when they are the trainer's up to float rounding (the native engine runs the policy's weights in
    float32, and the training forwards resolve to float32 too), else recomputes: a bf16 trainer against a
    float32 engine would start every update off-policy by the rounding gap."""
    if cfg.old_logprobs != "auto":
        return cfg.old_logprobs
    exact = backend == "native" and resolve_precision(cfg.precision, device_type) == "32-true"
    return "rollout" if exact else "recompute"


def rollout_old_logprobs(module: GRPOModule, batch: GRPOBatch) -> GRPOBatch:
    """`batch` with pi_old = the engine's log-probs (`grpo.old_logprobs=rollout`: no policy forward), and with
    the KL term on, the reference's log-probs in length-sorted micro-batches."""
    if batch.sampler_logprobs is None:
        raise ValueError("grpo.old_logprobs=rollout needs the engine's log-probs in batch.sampler_logprobs")
    ref = None
    if module.cfg.kl_coef > 0:
        ref = torch.zeros_like(batch.sampler_logprobs)
        lengths = batch.attention_mask.sum(1)
        for index in micro_batches(lengths, module.cfg.micro_batch_tokens, module.cfg.micro_batch_overhead_tokens):
            chunk = module.reference_logprobs(batch.rows(index))
            ref[index, : chunk.shape[1]] = chunk
    return dataclasses.replace(batch, old_logprobs=batch.sampler_logprobs, ref_logprobs=ref)


def recompute_old_logprobs(
    module: GRPOModule,
    batch: GRPOBatch,
    on_chunk: Callable[[GRPOBatch, torch.Tensor], None] | None = None,
) -> GRPOBatch:
    """`batch` with old (and, with KL on, reference) log-probs filled in by `module.recompute`, one
    length-sorted micro-batch at a time (`micro_batches`); `on_chunk(chunk, hidden [b, T_b, D])` sees each
    micro-batch's forward (the trainer fills the drafter buffer from it)."""
    cfg = module.cfg
    old = torch.zeros(batch.size, batch.input_ids.shape[1] - 1, device=batch.input_ids.device)  # [B, T - 1]
    ref = torch.zeros_like(old) if cfg.kl_coef > 0 else None
    lengths = batch.attention_mask.sum(1)
    for index in micro_batches(lengths, cfg.micro_batch_tokens, cfg.micro_batch_overhead_tokens):
        chunk, hidden = module.recompute(batch.rows(index))
        T1 = chunk.old_logprobs.shape[1]
        old[index, :T1] = chunk.old_logprobs
        if ref is not None:
            ref[index, :T1] = chunk.ref_logprobs
        if on_chunk is not None:
            on_chunk(chunk, hidden)
    return dataclasses.replace(batch, old_logprobs=old, ref_logprobs=ref)


def accumulate_loss(
    module: GRPOModule,
    batch: GRPOBatch,
    rows: torch.Tensor,
    denominator: float,
    passes: Callable[[int], int] | None = None,
) -> torch.Tensor:
    """Backpropagate token_sum(GRPO loss over `rows` of `batch`) / denominator, one length-sorted micro-batch
    at a time (`micro_batches`); the accumulated gradient is that of one forward over all the rows.
    `passes(this worker's micro-batch count)` asks for that many forward + backward passes in all: passes of
    weight 0 over the batch's shortest row come first, as the workers of a sharded policy must all run as many
    (`tlt.training.distributed.fsdp`).

    Returns the token sums of (loss, policy_loss, kl, entropy, clip_fraction) over the rows, [5] float64.
    """
    sums = torch.zeros(5, dtype=torch.float64, device=batch.input_ids.device)
    cfg = module.cfg
    lengths = batch.attention_mask[rows].sum(1)
    chunks = micro_batches(lengths, cfg.micro_batch_tokens, cfg.micro_batch_overhead_tokens)
    fillers = 0 if passes is None else passes(len(chunks)) - len(chunks)
    if fillers > 0:
        shortest = batch.rows(batch.attention_mask.sum(1).argmin().view(1))
        for _ in range(fillers):
            (module.loss(shortest).loss * 0.0).backward()
    for index in chunks:
        chunk = batch.rows(rows[index])
        out = module.loss(chunk)
        n = chunk.loss_mask.sum().double()
        (out.loss * (n / denominator)).backward()
        terms = (out.loss.detach(), out.policy_loss, out.kl, out.entropy, out.clip_fraction)
        sums += torch.stack([t.detach().double() for t in terms]) * n
    return sums


def update_policy(
    module: GRPOModule,
    optimizer: torch.optim.Optimizer,
    batch: GRPOBatch,
    generator: torch.Generator,
    rows_here: Callable[[torch.Tensor], torch.Tensor] | None = None,
    sum_over_workers: Callable[[torch.Tensor], torch.Tensor] | None = None,
    passes: Callable[[int], int] | None = None,
) -> UpdateStats:
    """`cfg.epochs` passes over `batch` (old log-probs filled in); a step per shuffled minibatch, its gradient
    accumulated over micro-batches of at most `cfg.micro_batch_tokens` padded tokens.

    Data-parallel workers that all hold `batch` (`data_parallel.update_policy_sharded`) pass `rows_here`, the
    rows of a minibatch this worker backpropagates, and `sum_over_workers`, which sums the parameter gradients
    and the given loss sums ([5] float64) over the workers and returns the summed loss sums; without them this
    process backpropagates every row. `passes` goes to `accumulate_loss` (a sharded policy's workers must all
    run as many forwards; `tlt.training.distributed.fsdp`).
    """
    cfg = module.cfg
    device = batch.input_ids.device
    minibatches = [
        index.to(device)
        for _ in range(cfg.epochs)
        for index in torch.randperm(batch.size, generator=generator).split(cfg.minibatch_size)
    ]
    totals = torch.zeros(6, dtype=torch.float64)  # loss, policy_loss, kl, entropy, clip_fraction, grad_norm
    for index in minibatches:
        count = batch.loss_mask[index].sum().clamp(min=1).item()  # the minibatch's response tokens
        optimizer.zero_grad(set_to_none=True)
        mine = index if rows_here is None else rows_here(index).to(device)
        sums = accumulate_loss(module, batch, mine, count, passes)  # token sums of the 5 loss terms
        if sum_over_workers is not None:
            sums = sum_over_workers(sums)
        norm = torch.nn.utils.clip_grad_norm_(module.policy.parameters(), cfg.max_grad_norm)
        if isinstance(norm, DTensor):  # a sharded policy's
            norm = norm.full_tensor()
        optimizer.step()
        totals += torch.cat([sums.cpu() / count, norm.detach().double().cpu().view(1)])
    means = (totals / len(minibatches)).tolist()
    return UpdateStats(len(minibatches), *means)
