"""`tlt train` on 2 processes (gloo) with TLT on (spot): the ranks end with bit-identical policies and
drafters, rank 0 alone logs one metrics row per step and writes the checkpoint with every rank's own state,
the rank that finished its share early trains the drafter during the other's rollout, a resume continues
every rank's state; the data-parallel policy update equals one process's update over the same rollouts."""

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from tests.training import dp_workers
from tests.training.test_train_cli import config  # noqa: F401  (the fixture: a random test-preset policy)
from tlt.cli import main
from tlt.config import ConfigError, load_config
from tlt.training.distributed.data_parallel import balanced_share, shard
from tlt.training.distributed.launch import launch_cpu
from tlt.training.run_log import COLUMNS
from tlt.training.train import run_train


@pytest.fixture(scope="module")
def two_steps(config, tmp_path_factory):  # noqa: F811
    """A 2-rank, 2-step run of the ranks' own entry point (as `tlt train ... train.devices=2` spawns them);
    rank 0's rollout takes 0.8 s longer."""
    out = tmp_path_factory.mktemp("dp") / "run"
    cfg = load_config(config, ["train.devices=2", "scheduler.policy=spot", "grpo.steps=2", f"output_dir={out}"])
    summaries = launch_cpu(dp_workers.train_with_slow_rank0, 2, cfg, timeout_s=80)
    shutil.copytree(out, out.parent / "after-2-steps")  # `resumed` continues `out`
    return out.parent / "after-2-steps", summaries


@pytest.fixture(scope="module")
def resumed(config, two_steps):  # noqa: F811
    """The same run resumed to 3 steps by `run_train`, which spawns the ranks as `tlt train` does."""
    out = two_steps[0].parent / "run"
    cfg = load_config(config, ["train.devices=2", "scheduler.policy=spot", "grpo.steps=3", f"output_dir={out}"])
    return out, run_train(cfg, reward_fn=dp_workers.length_reward)


@pytest.fixture(scope="module")
def equivalence():
    """Per rank, the sharded update against one process's (`dp_workers.run_equivalence`)."""
    return launch_cpu(dp_workers.run_equivalence, 2, timeout_s=60)


@pytest.fixture(scope="module", params=[False, True], ids=["plain", "activation-checkpointing"])
def fsdp(request):
    """Per rank, `ShardedPolicy` (with or without activation checkpointing) against the replicated update
    (`dp_workers.fsdp_equivalence`)."""
    return launch_cpu(dp_workers.fsdp_equivalence, 2, request.param, timeout_s=120)


@pytest.fixture(scope="module")
def fsdp_runs(config, tmp_path_factory):  # noqa: F811
    """`tlt train` under train.sharding=fsdp on 2 ranks (drafter trained between steps, timing-independent):
    3 steps straight, 2 steps resumed to 3, and the same 2 steps resumed to 3 under train.sharding=replicate."""
    root = tmp_path_factory.mktemp("fsdp")
    common = ["train.devices=2", "scheduler.policy=between_steps"]

    def train(name: str, steps: int, sharding: str = "fsdp") -> None:
        args = [*common, f"train.sharding={sharding}", f"grpo.steps={steps}", "--output-dir", str(root / name)]
        assert main(["train", str(config), *args]) == 0

    train("straight", 3)
    train("resumed", 2)
    shutil.copytree(root / "resumed", root / "switched")
    train("resumed", 3)
    train("switched", 3, "replicate")
    return root / "straight", root / "resumed", root / "switched"


def _metrics(out) -> list[dict]:
    return json.loads((out / "checkpoint" / "metrics.json").read_text())


def test_ranks_end_identical_and_rank_0_logs_once_per_step(two_steps):
    out, (summary, other) = two_steps
    assert other is None  # rank 1 neither logs nor summarises
    assert summary["devices"] == 2 and summary["replicas_identical"] and summary["steps"] == 2
    rows = [line.split(",") for line in (out / "metrics.csv").read_text().splitlines()]
    assert rows[0] == COLUMNS and [r[0] for r in rows[1:]] == ["0", "1"]
    for m in _metrics(out):
        assert m["num_samples"] == 8 and m["optimizer_steps"] == 2 and m["version"] == m["step"] + 1
        assert m["logprob_gap"] < 1e-3 and m["sd_token_share"] > 0
    assert json.loads((out / "summary.json").read_text()) == summary
    meta = json.loads((out / "checkpoint" / "meta.json").read_text())
    assert meta == {"step": 2, "version": 2, "world_size": 2}


def test_the_early_rank_trains_the_drafter_during_the_other_ranks_rollout(two_steps):
    out, _ = two_steps
    for m in _metrics(out):
        assert m["spot_steps"] >= 1 and m["drafter_steps"] == m["spot_steps"] and m["drafter_loss"] > 0
        assert m["idle_seconds"] > 0 and m["idle_train_seconds"] > 0  # spot_steps counts what ran there
    state = torch.load(out / "checkpoint" / "trainer.pt", weights_only=True)
    ranks = [r["trainer"] for r in state["ranks"]]
    assert len(ranks) == 2 and not {"tuner", "buffer", "drafter_optimizer"} & state["trainer"].keys()
    assert ranks[0]["drafter_optimizer"]["state"] == {}  # rank 0 finished last: it never trained
    assert ranks[1]["drafter_optimizer"]["state"]  # rank 1 trained while rank 0 still rolled out
    buffers = [[s["tokens"] for s in r["buffer"]["samples"]] for r in ranks]
    assert len(buffers[0]) == len(buffers[1]) == 8  # each rank's own rollouts: 2 steps x 1 prompt x G = 4
    assert not all(torch.equal(a, b) for a, b in zip(buffers[0], buffers[1], strict=True))


def test_resume_restores_every_rank(resumed):
    out, summary = resumed
    assert summary["steps"] == 3 and summary["replicas_identical"]
    rows = (out / "metrics.csv").read_text().splitlines()
    assert [r.split(",")[0] for r in rows[1:]] == ["0", "1", "2"]
    last = _metrics(out)[2]
    assert last["step"] == 2 and last["version"] == 3
    assert last["buffer_samples"] == 24  # both ranks kept their buffers across the resume: 2 x 3 steps x 4


@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_sharded_update_equals_one_process(equivalence, optimizer):
    a, b = (r[optimizer] for r in equivalence)
    single = a["single"]
    assert a["rows"] == list(range(8)) and b["rows"] == list(range(8, 12))  # uneven shards, whole groups
    assert torch.equal(a["params"], b["params"])  # every rank takes the same step
    assert (a["params"] - a["start"]).abs().max() > 100 * (a["params"] - single["params"]).abs().max()
    # equal up to float summation order (AdamW's normalisation amplifies that noise on tiny gradients)
    atol = 1e-6 if optimizer == "sgd" else 2e-5
    torch.testing.assert_close(a["params"], single["params"], rtol=0, atol=atol)
    for key, value in vars(single["stats"]).items():
        assert getattr(a["stats"], key) == pytest.approx(value, rel=1e-5, abs=1e-7), key


def test_gather_rows_rebuilds_the_global_batch_from_uneven_shares(equivalence):
    a, b = (r["adamw"] for r in equivalence)
    full, gathered = a["full"], a["gathered"]
    assert a["width"] != b["width"]  # each share was trimmed to its own longest row
    for name in ("input_ids", "attention_mask", "response_mask", "advantages"):
        assert getattr(gathered, name).dtype == getattr(full, name).dtype
        assert torch.equal(getattr(gathered, name), getattr(full, name)), name
    mask = full.loss_mask
    for name in ("old_logprobs", "ref_logprobs"):  # equal where they are used; zeros past a share's width
        assert torch.equal(getattr(gathered, name)[mask], getattr(full, name)[mask]), name
    assert gathered.sampler_logprobs is None
    assert all(torch.equal(getattr(gathered, f), getattr(b["gathered"], f)) for f in ("input_ids", "old_logprobs"))


def test_balanced_share_deals_each_row_once_and_evens_the_tokens():
    lengths = torch.tensor([500, 40, 60, 50, 45, 55, 300, 35])  # a long tail: rows 0 and 6
    index = torch.tensor([6, 0, 1, 2, 3, 4, 5, 7])
    shares = [balanced_share(lengths, index, 2, r).tolist() for r in range(2)]
    assert shares == [[0, 1], [2, 3, 4, 5, 6, 7]]  # 540 and 545 tokens; rows 0-3 vs 4-7 would be 650 / 435
    three = [balanced_share(lengths, index[:2], 3, r).tolist() for r in range(3)]
    assert three == [[0], [6], []]  # fewer rows than ranks: one rank sits this minibatch out


def test_shard_splits_whole_prompts_deterministically():
    assert [shard(5, r, 2) for r in range(2)] == [(0, 3), (3, 2)]
    assert [shard(8, r, 4) for r in range(4)] == [(0, 2), (2, 2), (4, 2), (6, 2)]
    assert sum(shard(7, r, 3)[1] for r in range(3)) == 7


def test_config_errors_before_any_process_starts(config, tmp_path, capsys):  # noqa: F811
    out = tmp_path / "run"
    assert main(["train", str(config), "train.devices=3", "--output-dir", str(out)]) == 2
    assert "rollout.prompts_per_step: got 2 for 3 processes" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="train.devices: got 0"):
        load_config(config, ["train.devices=0"])


def test_a_multiprocess_checkpoint_resumes_only_with_as_many_processes(two_steps, config, capsys):  # noqa: F811
    out, _ = two_steps
    assert main(["train", str(config), "grpo.steps=5", "scheduler.policy=spot", "--output-dir", str(out)]) == 2
    assert "written by a run of 2 process(es), this run has 1" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("name", "text"), [("metrics.json", "[{"), ("trainer.pt", "not a torch file"), ("policy/model.safetensors", "cut")]
)
def test_a_damaged_multiprocess_checkpoint_is_one_error_before_any_rank_starts(
    two_steps,
    config,  # noqa: F811
    tmp_path,
    capsys,
    name,
    text,
):
    out = tmp_path / "run"
    shutil.copytree(two_steps[0], out)
    (out / "checkpoint" / name).write_text(text)
    argv = ["train", str(config), "train.devices=2", "scheduler.policy=spot", "grpo.steps=5", "--output-dir", str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("tlt train: error: cannot resume from") and err.count("\n") == 1, err
    assert f"checkpoint/{name}: " in err and (out / "checkpoint" / name).read_text() == text


def test_fsdp_update_equals_the_replicated_one(fsdp):
    a, b = fsdp
    assert a["calls"]["sharded"] == b["calls"]["sharded"]  # FSDP: as many forwards on every rank ...
    assert a["calls"]["sharded"] > min(a["calls"]["replicated"], b["calls"]["replicated"])  # ... padded
    replicated, sharded = a["params"]
    assert torch.equal(sharded, b["params"][1])  # every rank's replica holds the same weights
    assert (replicated - a["start"]).abs().max() > 1000 * (replicated - sharded).abs().max()
    torch.testing.assert_close(sharded, replicated, rtol=0, atol=2e-5)  # float summation order only
    for one, other in a["stats"]:
        for key, value in vars(one).items():
            assert getattr(other, key) == pytest.approx(value, rel=1e-5, abs=1e-7), key


def test_fsdp_optimizer_state_is_saved_in_the_replicated_layout_and_loads_back(fsdp):
    a, _ = fsdp
    replicated, sharded = a["states"]
    assert sharded["param_groups"] == replicated["param_groups"]
    assert sharded["state"].keys() == replicated["state"].keys()
    for index, entry in replicated["state"].items():
        for key, value in entry.items():
            assert not hasattr(sharded["state"][index][key], "placements")  # a plain full tensor
            torch.testing.assert_close(sharded["state"][index][key], value, rtol=1e-4, atol=1e-7)
    continued, loaded = a["after_load"]
    assert torch.equal(continued, loaded)  # a fresh ShardedPolicy from the saved state takes the same step


def test_fsdp_optimizer_state_round_trips_through_a_file_to_fsdp_and_to_one_process(tmp_path):
    """`dp_workers.fsdp_state_round_trip`: the next update from the saved state equals the uninterrupted one."""
    a, b = launch_cpu(dp_workers.fsdp_state_round_trip, 2, str(tmp_path), timeout_s=120)
    assert all(torch.equal(x, y) for x, y in zip(a["third"] + a["fourth"], b["third"] + b["fourth"], strict=True))
    straight, fresh, single, cold = a["third"]
    assert torch.equal(fresh, straight)  # a fresh 2-rank ShardedPolicy: the same shards, the same step
    close = {"rtol": 0, "atol": 1e-5}  # float summation order (AdamW moves weights ~5e-3 here)
    torch.testing.assert_close(single, straight, **close)  # one process's AdamW from the FSDP state
    assert (straight - a["before"]).abs().max() > 100 * close["atol"]
    assert (cold - straight).abs().max() > 100 * close["atol"]  # without the saved state the step differs
    torch.testing.assert_close(a["fourth"][1], a["fourth"][0], **close)  # one process's state back into FSDP


def test_an_fsdp_run_resumes_bit_for_bit_with_identical_replicas(fsdp_runs):
    straight, resumed, _ = fsdp_runs
    for out in (straight, resumed):
        summary = json.loads((out / "summary.json").read_text())
        assert summary["steps"] == 3 and summary["devices"] == 2 and summary["replicas_identical"]
    weights = [load_file(out / "checkpoint" / "policy" / "model.safetensors") for out in (straight, resumed)]
    assert weights[0].keys() == weights[1].keys()
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
    files = [out / "checkpoint" / "trainer.pt" for out in (straight, resumed)]
    states = [torch.load(f, weights_only=True)["trainer"] for f in files]
    optimizer = [s["optimizer"]["state"] for s in states]
    assert optimizer[0].keys() == optimizer[1].keys() and all(isinstance(k, int) for k in optimizer[0])
    for k in optimizer[0]:
        assert all(torch.equal(optimizer[0][k][n], optimizer[1][k][n]) for n in optimizer[0][k])
    ignore = {c for c in COLUMNS if c.endswith("_seconds")} | {"timeline"}
    rows = [[{k: v for k, v in m.items() if k not in ignore} for m in _metrics(out)] for out in (straight, resumed)]
    assert rows[0] == rows[1] and rows[0][-1]["optimizer_steps"] == 2


def test_an_fsdp_checkpoint_resumes_under_replicate(fsdp_runs):
    straight, _, switched = fsdp_runs
    assert json.loads((switched / "summary.json").read_text())["replicas_identical"]
    a, b = (load_file(out / "checkpoint" / "policy" / "model.safetensors") for out in (straight, switched))
    for k in a:  # the same rollouts, an update equal up to float summation order (AdamW moves weights ~1e-3)
        torch.testing.assert_close(b[k], a[k], rtol=0, atol=1e-5)


def test_fsdp_needs_several_processes(config, tmp_path, capsys):  # noqa: F811
    out = tmp_path / "run"
    assert main(["train", str(config), "train.sharding=fsdp", "--output-dir", str(out)]) == 2
    assert "train.sharding=fsdp shards the policy update over processes" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="train.sharding: got 'zero3'"):
        load_config(config, ["train.sharding=zero3"])


def test_a_suffix_drafters_history_holds_every_ranks_responses(config, tmp_path):  # noqa: F811
    """With drafter.kind=suffix on 2 ranks, each rank's history takes in the other's responses after every step,
    so the checkpoint (rank 0's drafter) holds all 2 steps x 2 prompts x 4 samples, not rank 0's half."""
    from tlt.drafters import load_drafter

    args = ["train.devices=2", "drafter.kind=suffix", "scheduler.policy=never", "grpo.steps=2"]
    assert main(["train", str(config), *args, "--output-dir", str(tmp_path / "run")]) == 0
    history = load_drafter(tmp_path / "run" / "checkpoint" / "drafter").history()
    assert sum(len(h["responses"]) for h in history) == 2 * 2 * 4
    assert len(history) == 2 * 2  # the 4 prompts of the 2 steps (each rank drew 1 per step)


def _torchrun(config, out, *overrides) -> subprocess.CompletedProcess:  # noqa: F811
    """`torchrun --standalone --nproc-per-node 2 -m tlt.cli train CONFIG ...`, as the docs start a multi-GPU run."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "tlt.cli"]
    command += ["train", str(config), *overrides, "--output-dir", str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(command, capture_output=True, text=True, timeout=240, env=env)


def test_tlt_train_under_torchrun_runs_as_ranks_of_that_job(config, tmp_path):  # noqa: F811
    """Under torchrun each process is one gloo rank of the launcher's job (not spawning its own): rank 0 writes the
    summary and one metrics row per step, and the ranks end with identical replicas; train.devices other than 1
    or WORLD_SIZE stops every rank with the key named."""
    out = tmp_path / "run"
    done = _torchrun(config, out, "grpo.steps=1", "scheduler.policy=between_steps")
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["devices"] == 2 and summary["replicas_identical"] is True
    assert len((out / "metrics.csv").read_text().splitlines()) == 2  # header + one step
    bad = _torchrun(config, tmp_path / "bad", "grpo.steps=1", "train.devices=3")
    assert bad.returncode != 0 and "train.devices" in bad.stderr and "WORLD_SIZE=2" in bad.stderr
