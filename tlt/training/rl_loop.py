"""One TLT RL step, wired from the parts (DESIGN.md, "Data flow of one RL step"): the sequence for one process and,
through `DistributedRLTrainer`'s hooks (training/distributed/data_parallel.py), for N.

    prompts -> engine.generate (n = G, adaptive SD with the current drafter) -> rewards -> group advantages
    -> recompute pi_old + post-norm hidden states (these feed the drafter buffer) -> GRPO policy update
    -> drafter micro-steps -> push(new policy, new drafter, version + 1)

The engine owns its own copy of the model and gets weights only through `push` (policy and drafter together,
one version), so the trainer never shares tensors with the rollout. Versions: the initial policy is version
0; the rollouts of step k come from version k and are stored in the buffer as version k; after the step the
engine runs version k + 1.

Single process, the drafter trains between steps: there is no other worker whose rollout it could overlap,
so no worker is ever idle. `between_steps` runs `scheduler.between_steps_budget` micro-steps
(`DrafterStepper`) after the update; `spot` trains only within a wall-time budget there, micro-steps until
they have taken `scheduler.no_idle_budget` of the step's rollout + training seconds (checked between
chunks of `drafter.preempt_tokens`), so TLT's drafter costs at most that share of a step where it has no
idle time to use (which makes a one-process `spot` run depend on timing, like a multi-process one); both
take at most `drafter.max_epochs_per_step` passes over the buffer; `never` none. Online
training is for EAGLE drafters (n-gram and small-LM drafters stay as they are; asking to train them is a
config error). With `speculative.enabled=false` there is no drafter, no
buffer and no drafter training: the plain-decoding baseline.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist

from tlt.backends import check_backend_config, engine_from_config
from tlt.backends.base import DecodeStepStats, FinishReason, Rollout, SamplingParams
from tlt.config import ConfigError, RunConfig
from tlt.data.prompts import format_prompt
from tlt.data.rewards import count_grading_errors, math_rewards
from tlt.data.tasks import MathProblem
from tlt.drafters.base import Drafter
from tlt.drafters.suffix import SuffixDrafter
from tlt.eval.heldout import LengthStats
from tlt.training.drafter.buffer import DrafterBuffer, DrafterSample
from tlt.training.drafter.checkpoint import AsyncDrafterCheckpoint, load_drafter_state
from tlt.training.drafter.spot import DrafterStepper
from tlt.training.grpo import (
    GRPOBatch,
    GRPOModule,
    UpdateStats,
    group_advantages,
    make_batch,
    old_logprobs_source,
    recompute_old_logprobs,
    rollout_old_logprobs,
    update_policy,
)
from tlt.training.weight_push import push

log = logging.getLogger(__name__)
# (responses, gold answers) -> reward per response; NaN for a response it could not grade (counted, scored 0)
RewardFn = Callable[[list[str], list[str]], list[float]]


@dataclass
class StepMetrics:
    """What one RL step did; seconds are wall-clock on this process (over ranks: `combine`)."""

    step: int  # 0-based RL step
    version: int  # policy version the engine runs after the step (its rollouts used version - 1)
    num_samples: int  # rollouts: prompts_per_step * G
    reward_mean: float
    reward_errors: int  # responses the reward function could not grade (NaN, scored 0; logged)
    accuracy: float  # share of samples with reward >= 1
    response_len_mean: float  # response tokens, EOS included
    response_len_p50: float
    response_len_p90: float
    response_len_max: int
    truncated: float  # share of samples that hit max_new_tokens (or the context limit)
    rollout_seconds: float
    train_seconds: float  # rewards, log-prob recompute + buffer fill, policy update
    drafter_seconds: float  # drafter micro-steps
    push_seconds: float
    accept_length: float  # tokens per SD verify and row (accepted drafts + bonus); 0 when no SD step ran
    sd_token_share: float  # share of decode-step tokens from SD steps (first tokens come from prefill)
    loss: float  # means over the update's optimizer steps
    policy_loss: float
    kl: float
    entropy: float
    clip_fraction: float
    grad_norm: float
    optimizer_steps: int
    logprob_gap: float  # mean |engine - trainer| log-prob over response tokens (~1e-6 in float32)
    drafter_steps: int
    drafter_loss: float | None  # mean micro-step loss; None when the drafter did not train
    buffer_samples: int  # samples in the drafter buffer after the step (0 without one; summed over ranks)
    # Multi-process runs (tlt.training.distributed.data_parallel), summed over ranks; 0 in one process:
    spot_steps: int = 0  # drafter micro-steps run in idle time, while another rank still rolled out (`spot`)
    idle_seconds: float = 0.0  # time ranks waited between their own share's end and the last rank's
    idle_train_seconds: float = 0.0  # of that idle time, seconds spent in drafter micro-steps
    drafter_checkpoint_seconds: float = 0.0  # the step blocked this long for its async drafter checkpoint
    # A composed drafter (drafter.kind=eagle+suffix), summed over ranks: SD verifies (rows) each part drafted and
    # the draft tokens accepted on them; 0 with any other drafter
    learned_verifies: int = 0
    learned_accepted: int = 0
    suffix_verifies: int = 0
    suffix_accepted: int = 0
    # The decode steps of the step's slowest generate (`decode_timeline`): not a scalar, so not in metrics.csv
    timeline: list[list] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


class ProblemSampler:
    """Batches of problems: passes over a seeded shuffle, reshuffled each pass (each problem once a pass)."""

    def __init__(self, problems: Sequence[MathProblem], batch_size: int, seed: int):
        if not problems:
            raise ValueError("ProblemSampler needs at least one problem")
        self.problems, self.batch_size = list(problems), batch_size
        self.rng = random.Random(seed)
        self.order: list[int] = []

    def next(self) -> list[MathProblem]:
        out = []
        while len(out) < self.batch_size:
            if not self.order:
                self.order = list(range(len(self.problems)))
                self.rng.shuffle(self.order)
            out.append(self.problems[self.order.pop()])
        return out

    def state_dict(self) -> dict:
        return {"rng": self.rng.getstate(), "order": list(self.order)}

    def load_state_dict(self, state: dict) -> None:
        self.rng.setstate(state["rng"])
        self.order = list(state["order"])


def initial_drafter(cfg: RunConfig, target: torch.nn.Module) -> Drafter:
    """The drafter to start from: the saved one at drafter.path, else a fresh one of drafter.kind. A composed
    kind (`eagle+suffix`) adds a fresh suffix drafter to that learned one, unless the saved one is composed."""
    from tlt.drafters import drafter_class, load_drafter
    from tlt.drafters.composed import ComposedDrafter
    from tlt.drafters.suffix import SuffixDrafter

    learned_kind, *composed = cfg.drafter.kind.split("+")
    if cfg.drafter.path:
        try:
            drafter = load_drafter(cfg.drafter.path)
        except ValueError as e:  # a folder that is not a drafter's, or a damaged one: a one-line CLI error
            raise ConfigError(f"drafter.path: {e}") from e
    else:
        drafter = drafter_class(learned_kind).from_config(cfg.drafter, target, cfg.seed)
    if composed and not isinstance(drafter, ComposedDrafter):
        drafter = ComposedDrafter(drafter, SuffixDrafter.from_config(cfg.drafter, target))
    return drafter


def check_rl_config(cfg: RunConfig) -> None:
    """What the RL loop needs beyond each section's own validation; raises ConfigError."""
    check_backend_config(cfg)
    if cfg.rollout.temperature <= 0:
        raise ConfigError("rollout.temperature: GRPO needs sampled groups, got 0 (greedy); use e.g. 1.0")
    online = cfg.speculative.enabled and cfg.scheduler.policy != "never"
    if cfg.grpo.old_logprobs == "rollout" and online and cfg.rollout.backend != "native":
        raise ConfigError(
            f"grpo.old_logprobs: rollout fills the drafter buffer from the engine's hidden states, which "
            f"rollout.backend={cfg.rollout.backend} does not return; use recompute (or auto) while the drafter "
            "trains online"
        )
    if cfg.rollout.samples_per_prompt < 2:
        raise ConfigError(
            f"rollout.samples_per_prompt: got {cfg.rollout.samples_per_prompt}; GRPO needs groups of >= 2"
        )


def sharding_error(cfg: RunConfig) -> str:
    return (
        f"train.sharding={cfg.train.sharding} shards the policy update over processes and needs a multi-process "
        "run (train.devices=N on CPU, torchrun on GPUs); one process updates its whole policy: use replicate"
    )


def decode_timeline(steps: list[DecodeStepStats]) -> list[list]:
    """A generate's decode steps as runs of equal running batch and strategy, in order:
    [running batch, strategy ('' = plain decoding), decode steps, seconds, generated tokens] per run
    (what the long-tail picture of `tlt.eval.compare` draws)."""
    runs: list[list] = []
    for s in steps:
        strategy = s.strategy if s.sd_on else ""
        if runs and runs[-1][0] == s.running_batch and runs[-1][1] == strategy:
            runs[-1][2] += 1
            runs[-1][3] += s.seconds
            runs[-1][4] += s.generated_tokens
        else:
            runs.append([s.running_batch, strategy, 1, s.seconds, s.generated_tokens])
    return runs


def decode_sums(steps: list[DecodeStepStats]) -> list[float]:
    """What `decode_stats` divides, summable over ranks: [accepted + rows of SD steps, rows of SD steps, tokens
    of SD steps, tokens of all decode steps]."""
    sd = [s for s in steps if s.sd_on]
    rows = sum(s.running_batch for s in sd)
    return [
        float(sum(s.accepted_tokens for s in sd) + rows),
        float(rows),
        float(sum(s.generated_tokens for s in sd)),
        float(sum(s.generated_tokens for s in steps)),
    ]


def decode_stats(steps: list[DecodeStepStats]) -> tuple[float, float]:
    """(acceptance length per SD verify and row, share of decode-step tokens from SD steps) of a generate."""
    return _decode_ratios(decode_sums(steps))


def _decode_ratios(sums: list[float]) -> tuple[float, float]:
    return sums[0] / sums[1] if sums[1] else 0.0, sums[2] / sums[3] if sums[3] else 0.0


@dataclass
class Generated:
    """A rank's rollout of its prompts, before its local work."""

    problems: list[MathProblem]
    rollouts: list[Rollout]
    decode: list[float]  # `decode_sums` of the generate
    timeline: list[list]  # `decode_timeline` of the generate
    start: float  # clock at the start of the step
    end: float  # clock at the end of the generation


@dataclass
class Share:
    """A rank's rollout after its local work: what it brings to the policy update."""

    rollouts: list[Rollout]
    rewards: torch.Tensor  # [b]
    reward_errors: int  # responses the reward function could not grade
    batch: GRPOBatch  # old (and reference) log-probs filled in
    decode: list[float]  # `decode_sums` of the generate
    timeline: list[list]  # `decode_timeline` of the generate
    generate_seconds: float
    local_seconds: float  # rewards, advantages, recompute and buffer fill
    end: float  # clock at the end of the share


@dataclass
class Overlap:
    """Drafter training and waiting between the end of a rank's share and the step's policy update: none in
    one process; on N processes what `SpotWorker` did while other ranks still rolled out."""

    idle: float = 0.0  # seconds waited for the other ranks
    idle_train: float = 0.0  # of those, seconds spent in drafter micro-steps
    drafter_steps: int = 0  # micro-steps that entered the reconciled drafter
    spot_steps: int = 0  # micro-steps in idle time
    losses: list[float] = field(default_factory=list)


@dataclass
class RankPart:
    """What one rank contributes to a step's metrics (gathered from every rank, then `combine`d)."""

    lengths: list[int]  # response tokens per rollout of its share
    rewards: list[float]
    reward_errors: int
    truncated: int  # rollouts that hit the length limit
    decode: list[float]  # `decode_sums` of its decode steps
    timeline: list  # `decode_timeline` of its rollout
    gap: float  # summed |pi_old - sampler| log-prob gap over its loss tokens
    gap_tokens: float
    generate: float  # seconds: its rollout share
    local: float  # its local work on the share (rewards, pi_old, buffer)
    drafter: float  # waiting for the other ranks after its share, and drafter training after the update
    update: float  # the policy update
    push: float
    overlap: Overlap
    drafter_steps: int  # micro-steps of its drafter training, in idle time or after the update
    losses: list[float]  # their losses
    buffer: int  # drafter-buffer samples
    drafted: dict[str, dict[str, int]] = field(default_factory=dict)  # a composed drafter's `take_attribution`
    # with a suffix drafter on several ranks: this rank's responses of the step, per prompt (`history()` entries),
    # which the other ranks add to their own history (`DistributedRLTrainer._gather`)
    responses: list[dict] = field(default_factory=list)


def combine(parts: list[RankPart], step: int, version: int, update: UpdateStats) -> StepMetrics:
    """The step's `StepMetrics` from every rank's part (one in one process; data_parallel's module doc: what
    each field means over ranks)."""
    lengths = [n for p in parts for n in p.lengths]
    rewards = torch.tensor([r for p in parts for r in p.rewards])
    accept, sd_share = _decode_ratios([sum(p.decode[i] for p in parts) for i in range(4)])
    gap, gap_tokens = sum(p.gap for p in parts), sum(p.gap_tokens for p in parts)
    losses = [x for p in parts for x in p.losses]
    stats = LengthStats.of(lengths)
    return StepMetrics(
        step=step,
        version=version,
        num_samples=len(lengths),
        reward_mean=rewards.mean().item(),
        reward_errors=sum(p.reward_errors for p in parts),
        accuracy=(rewards >= 1).float().mean().item(),
        response_len_mean=stats.mean,
        response_len_p50=stats.p50,
        response_len_p90=stats.p90,
        response_len_max=stats.max,
        truncated=sum(p.truncated for p in parts) / len(lengths),
        rollout_seconds=max(p.generate for p in parts),
        train_seconds=max(p.local for p in parts) + max(p.update for p in parts),
        drafter_seconds=min(p.drafter for p in parts),
        push_seconds=max(p.push for p in parts),
        accept_length=accept,
        sd_token_share=sd_share,
        **asdict(update),
        logprob_gap=gap / max(gap_tokens, 1),
        drafter_steps=sum(p.drafter_steps for p in parts),
        drafter_loss=sum(losses) / len(losses) if losses else None,
        buffer_samples=sum(p.buffer for p in parts),
        spot_steps=sum(p.overlap.spot_steps for p in parts),
        idle_seconds=sum(p.overlap.idle for p in parts),
        idle_train_seconds=sum(p.overlap.idle_train for p in parts),
        **{
            f"{source}_{count}": sum(p.drafted.get(source, {}).get(count, 0) for p in parts)
            for source in ("learned", "suffix")
            for count in ("verifies", "accepted")
        },
        timeline=max(parts, key=lambda p: p.generate).timeline,
    )


class RLTrainer:
    """Single-process TLT RL: the trainable policy, its rollout engine, the drafter and its data buffer.

    Args:
        cfg: the run config (rollout, speculative, drafter, scheduler, grpo, seed).
        policy: HF Qwen2 / Llama causal LM to train; moved to `device`. The engine runs a deep copy.
        tokenizer: HF tokenizer (encodes prompts, decodes responses; eos and pad ids).
        problems: the prompts' source, drawn `rollout.prompts_per_step` at a time.
        drafter: the starting drafter when SD is on (default `initial_drafter(cfg, policy)`); the trainer
            trains this replica and pushes copies of it.
        reward_fn: (responses, gold answers) -> rewards; math answer checking by default.
        device: where policy, engine and buffer live (resolved by the caller).
    """

    SHARDINGS = ("replicate",)  # train.sharding values it runs (fsdp: data_parallel.DistributedRLTrainer)

    def __init__(
        self,
        cfg: RunConfig,
        policy: torch.nn.Module,
        tokenizer,
        problems: Sequence[MathProblem],
        drafter: Drafter | None = None,
        reward_fn: RewardFn = math_rewards,
        device: torch.device | str = "cpu",
    ):
        check_rl_config(cfg)
        if cfg.train.sharding not in self.SHARDINGS:
            raise ConfigError(sharding_error(cfg))
        self.cfg, self.tokenizer, self.reward_fn = cfg, tokenizer, reward_fn
        self.device = torch.device(device)
        self.policy = policy.to(self.device).eval()
        reference = copy.deepcopy(self.policy) if cfg.grpo.kl_coef > 0 else None
        self.module = GRPOModule(self.policy, cfg.grpo, cfg.rollout.temperature, reference)
        self.optimizer = self.module.configure_optimizers()
        self.generator = torch.Generator().manual_seed(cfg.seed)  # minibatch order
        self.sampler = ProblemSampler(problems, cfg.rollout.prompts_per_step, cfg.seed)
        sd = cfg.speculative.enabled
        self.drafter = (drafter or initial_drafter(cfg, self.policy)) if sd else None
        self.old_logprobs = old_logprobs_source(cfg.grpo, cfg.rollout.backend, self.device.type)
        trains_drafter = sd and cfg.scheduler.policy != "never"
        self.engine = engine_from_config(
            cfg,
            self.policy,
            tokenizer,
            self.drafter,
            self.device,
            self._engine_dir(),
            return_hidden=trains_drafter and self.old_logprobs == "rollout",  # the buffer's features
        )
        self.buffer, self.stepper = self._drafter_training()
        self.version, self.step_index = 0, 0
        self.drafter_checkpoint = self._drafter_checkpoint()
        self._push()

    def close(self) -> None:
        """Finish the drafter checkpoint in flight and shut the rollout engine down (a vllm / sglang engine runs
        in processes of its own)."""
        try:
            if self.drafter_checkpoint is not None:
                self.drafter_checkpoint.wait()
        finally:
            self.engine.close()

    def _drafter_checkpoint(self) -> AsyncDrafterCheckpoint | None:
        """The async drafter checkpoint of a run that trains its drafter (written by rank 0 alone), and the
        drafter optimizer state restored when drafter.path is such a checkpoint."""
        if self.stepper is None:
            return None
        if self.cfg.drafter.path:
            state = load_drafter_state(self.cfg.drafter.path)  # the weights came with initial_drafter
            if state is not None and state["optimizer"] is not None:
                self.stepper.optimizer.load_state_dict(state["optimizer"])
        every = self.cfg.train.drafter_checkpoint_every
        lead = not dist.is_initialized() or dist.get_rank() == 0
        return AsyncDrafterCheckpoint(Path(self.cfg.output_dir) / "drafter_latest") if every and lead else None

    def _checkpoint_drafter(self, metrics: StepMetrics) -> StepMetrics:
        """Snapshot this step's drafter checkpoint when due (written from the next step's rollout end, or at
        `close`); metrics with the seconds it blocked."""
        every = self.cfg.train.drafter_checkpoint_every
        if self.drafter_checkpoint is None or (self.step_index + 1) % every:
            return metrics
        blocked = self.drafter_checkpoint.save(self.trained, self.stepper.optimizer, self.step_index + 1, self.version)
        return dataclasses.replace(metrics, drafter_checkpoint_seconds=blocked)

    def _write_drafter_checkpoint(self) -> None:
        """Start writing the previous step's drafter snapshot, if its write has not started: called once the
        rollout is over, so the background write never shares a core with a rank that is still decoding."""
        if self.drafter_checkpoint is not None:
            self.drafter_checkpoint.start()

    def _engine_dir(self) -> Path:
        """Where a folder-based engine (vllm, sglang) keeps its model copy and weight updates."""
        rank = dist.get_rank() if dist.is_initialized() else 0
        return Path(self.cfg.output_dir) / "engine" / f"rank{rank}"

    def _drafter_training(self) -> tuple[DrafterBuffer | None, DrafterStepper | None]:
        """The buffer and stepper when the drafter trains online (SD on, policy not `never`), else Nones."""
        if self.drafter is None or self.cfg.scheduler.policy == "never":
            return None, None
        if self.trained.kind != "eagle":
            raise ConfigError(
                "scheduler.policy: online drafter training needs an EAGLE drafter, got "
                f"{self.drafter.kind!r}; set scheduler.policy=never to keep it frozen"
            )
        self.trained.bind(self.policy)  # the replica reads the policy's current embedding / LM head
        d = self.cfg.drafter
        buffer = DrafterBuffer(
            self.cfg.scheduler.buffer_bytes, d.buffer_decay, d.buffer_long_tokens, self.cfg.seed, self.device
        )
        return buffer, DrafterStepper(self.trained.head, buffer, d)

    @property
    def trained(self) -> Drafter | None:
        """The drafter whose weights train online: the drafter itself, or a composed drafter's learned part."""
        return getattr(self.drafter, "learned", self.drafter)

    def step(self) -> StepMetrics:
        """One RL step (module doc); returns its metrics. The engine runs the new version afterwards. On N
        processes (`DistributedRLTrainer`) the same sequence with a rank's hooks: `_share` rolls out its part of
        the prompts and waits for the other ranks (training the drafter meanwhile), `_update` is collective,
        `_gather` collects every rank's part of the metrics."""
        start = self._clock()
        share, overlap = self._share(self.sampler.next(), start)
        reconciled = self._clock()
        update = self._update(share.batch)
        update_end = self._clock()
        losses = self._train_drafter(update_end - start)
        drafter_end = self._clock()
        self.version += 1
        self._push()
        drafter = reconciled - share.end + drafter_end - update_end
        part = self._part(share, overlap, losses, drafter, update_end - reconciled, self._clock() - drafter_end)
        metrics = self._checkpoint_drafter(combine(self._gather(part), self.step_index, self.version, update))
        self.step_index += 1
        return metrics

    def _share(self, problems: list[MathProblem], start: float) -> tuple[Share, Overlap]:
        """The rollout of `problems` and its local work; in one process there is no one to wait for."""
        generated = self._generate(problems, start)
        self._write_drafter_checkpoint()
        return self._prepare(generated), Overlap()

    def _generate(self, problems: list[MathProblem], start: float) -> Generated:
        rollouts = self._rollout(problems)
        stats = self.engine.step_stats
        return Generated(problems, rollouts, decode_sums(stats), decode_timeline(stats), start, self._clock())

    def _prepare(self, gen: Generated) -> Share:
        """Rewards, advantages, recompute and buffer fill of the rollouts."""
        rewards, errors = self._rewards(gen.rollouts, gen.problems)
        batch = self._old_logprobs(self._batch(gen.rollouts, rewards), gen.rollouts)
        end = self._clock()
        seconds = gen.end - gen.start, end - gen.end
        return Share(gen.rollouts, rewards, errors, batch, gen.decode, gen.timeline, *seconds, end)

    def _update(self, batch: GRPOBatch) -> UpdateStats:
        return update_policy(self.module, self.optimizer, batch, self.generator)

    def _part(
        self, share: Share, overlap: Overlap, losses: list[float], drafter: float, update: float, push: float
    ) -> RankPart:
        """This process's part of the step's metrics (seconds: module doc of data_parallel)."""
        mask = share.batch.loss_mask
        gap = ((share.batch.old_logprobs - share.batch.sampler_logprobs).abs() * mask).sum().item()
        return RankPart(
            lengths=[r.token_ids.numel() for r in share.rollouts],
            rewards=share.rewards.tolist(),
            reward_errors=share.reward_errors,
            truncated=sum(r.finish_reason is FinishReason.LENGTH for r in share.rollouts),
            decode=share.decode,
            timeline=share.timeline,
            gap=gap,
            gap_tokens=mask.sum().item(),
            generate=share.generate_seconds,
            local=share.local_seconds,
            drafter=drafter,
            update=update,
            push=push,
            overlap=overlap,
            drafter_steps=overlap.drafter_steps + len(losses),
            losses=overlap.losses + losses,
            buffer=0 if self.buffer is None else len(self.buffer),
            drafted=self.drafter.take_attribution() if hasattr(self.drafter, "take_attribution") else {},
            responses=self._responses(share.rollouts),
        )

    @property
    def suffix(self) -> SuffixDrafter | None:
        """The suffix drafter (alone or a composed drafter's part) whose history the rollouts feed, else None."""
        found = getattr(self.drafter, "suffix", self.drafter)
        return found if isinstance(found, SuffixDrafter) else None

    def _responses(self, rollouts: list[Rollout]) -> list[dict]:
        """This step's responses per prompt, for the other ranks' suffix histories (none in one process)."""
        if self.suffix is None or not dist.is_initialized() or dist.get_world_size() == 1:
            return []
        groups: dict[int, dict] = {}
        for r in rollouts:
            entry = groups.setdefault(r.prompt_index, {"prompt": r.prompt_ids.tolist(), "responses": []})
            entry["responses"].append(r.token_ids.tolist())
        return list(groups.values())

    def _gather(self, part: RankPart) -> list[RankPart]:
        return [part]

    def state_dict(self) -> dict:
        """What the next steps depend on beyond the policy and drafter weights (the caller saves those as an
        HF folder and with `drafter.save`, and passes them back to the constructor): step, version, both
        optimizers, the minibatch generator, the problem sampler, the tuner, the drafter buffer and the KL
        reference."""
        return {
            "step": self.step_index,
            "version": self.version,
            "optimizer": self._optimizer_state(),
            "generator": self.generator.get_state(),
            "sampler": self.sampler.state_dict(),
            "reference": None if self.module.reference is None else self.module.reference.state_dict(),
            "tuner": None if self.engine.tuner is None else self.engine.tuner.state_dict(),
            "buffer": None if self.buffer is None else self.buffer.state_dict(),
            "drafter_optimizer": None if self.stepper is None else self.stepper.optimizer.state_dict(),
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore `state_dict()` into a trainer built from the same config with the saved policy and drafter,
        then push them to the engine as the saved version."""
        parts = {
            "reference": self.module.reference,
            "tuner": self.engine.tuner,
            "buffer": self.buffer,
            "drafter_optimizer": self.stepper,
        }
        for key, owner in parts.items():
            if (state[key] is None) != (owner is None):
                raise ValueError(
                    f"trainer state has {'no ' if state[key] is None else ''}{key!r} but this trainer "
                    f"{'needs' if owner is not None else 'has none'}: it was saved under another config"
                )
        self._load_optimizer_state(state["optimizer"])
        self.generator.set_state(state["generator"])
        self.sampler.load_state_dict(state["sampler"])
        if self.module.reference is not None:
            self.module.reference.load_state_dict(state["reference"])
        if self.engine.tuner is not None:
            self.engine.tuner.load_state_dict(state["tuner"])
        if self.buffer is not None:
            self.buffer.load_state_dict(state["buffer"])
            self.stepper.optimizer.load_state_dict(state["drafter_optimizer"])
        self.step_index, self.version = state["step"], state["version"]
        self._push()

    def _optimizer_state(self) -> dict:
        return self.optimizer.state_dict()

    def _load_optimizer_state(self, state: dict) -> None:
        self.optimizer.load_state_dict(state)

    def _rollout_seed(self) -> int:
        """The engine's sampling seed for this step's rollout."""
        return self.cfg.seed * 1_000_003 + self.step_index

    def _rollout(self, problems: list[MathProblem]) -> list[Rollout]:
        r = self.cfg.rollout
        seed = self._rollout_seed()
        sampling = SamplingParams(r.temperature, r.top_p, r.top_k, r.max_new_tokens, seed=seed)
        prompts = [self.tokenizer.encode(format_prompt(p.question)) for p in problems]
        return self.engine.generate(prompts, sampling, n=r.samples_per_prompt)

    def _rewards(self, rollouts: list[Rollout], problems: list[MathProblem]) -> tuple[torch.Tensor, int]:
        """([B] rewards, responses the reward function could not grade: its NaNs, scored 0); rollout i answers
        problem i // G (the engine groups samples by prompt)."""
        responses = [r.token_ids.tolist() for r in rollouts]
        texts = self.tokenizer.batch_decode(responses, skip_special_tokens=True)
        golds = [problems[r.prompt_index].answer for r in rollouts]
        rewards, errors = count_grading_errors([float(r) for r in self.reward_fn(texts, golds)])
        if errors:
            log.warning(
                "step %d: %d of %d responses could not be graded (scored 0)", self.step_index, errors, len(texts)
            )
        return torch.tensor(rewards, dtype=torch.float32), errors

    def _batch(self, rollouts: list[Rollout], rewards: torch.Tensor) -> GRPOBatch:
        cfg = self.cfg
        advantages = group_advantages(rewards, cfg.rollout.samples_per_prompt, cfg.grpo.scale_rewards)
        return make_batch(
            [r.prompt_ids for r in rollouts],
            [r.token_ids for r in rollouts],
            advantages,
            self.tokenizer.pad_token_id,
            [r.logprobs for r in rollouts],
        ).to(self.device)

    def _old_logprobs(self, batch: GRPOBatch, rollouts: list[Rollout]) -> GRPOBatch:
        """Fill in old (and reference) log-probs and the drafter buffer: by a recompute forward in
        length-sorted micro-batches (its hidden states -> buffer), or from the rollouts (`grpo.old_logprobs`)."""
        if self.old_logprobs == "recompute":
            return recompute_old_logprobs(self.module, batch, None if self.buffer is None else self._fill_buffer)
        if self.buffer is not None:
            samples = [DrafterSample.from_rollout(r, self.version) for r in rollouts]
            self.buffer.add([s for s in samples if s is not None])
        return rollout_old_logprobs(self.module, batch)

    def _fill_buffer(self, chunk: GRPOBatch, hidden: torch.Tensor) -> None:
        self.buffer.add_from_forward(chunk.input_ids, hidden, chunk.attention_mask, chunk.response_mask, self.version)

    def _train_drafter(self, step_seconds: float) -> list[float]:
        """Micro-step losses of this step's drafter training after `step_seconds` of rollout and training
        (none under `never` or without SD; module doc for `spot` and `between_steps` in one process)."""
        if self.stepper is None or len(self.buffer) == 0:
            return []
        scheduler = self.cfg.scheduler
        if scheduler.policy == "between_steps":
            return [self.stepper.step() for _ in range(min(scheduler.between_steps_budget, self.stepper.budget()))]
        deadline = self._clock() + scheduler.no_idle_budget * step_seconds
        spent = lambda: self._clock() >= deadline  # noqa: E731
        losses: list[float] = []
        while len(losses) < self.stepper.budget() and not spent():
            losses.append(self.stepper.step(spent))
        return losses

    def _push(self) -> None:
        state = self.policy.state_dict()
        if self.drafter is None:
            self.engine.update_weights(state, self.version)
        else:
            push(self.engine, state, self.drafter, self.version)

    def _clock(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()
