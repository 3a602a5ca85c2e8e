from pathlib import Path

import pytest

from tlt.config import ConfigError, RunConfig, load_config, to_yaml

ALL_YAML = sorted((Path(__file__).parents[1] / "configs").glob("*.yaml"))


def _is_grid(path: Path) -> bool:
    """A `tlt sweep` grid file (top-level `grid:` key), not a RunConfig."""
    import yaml

    return "grid" in (yaml.safe_load(path.read_text()) or {})


CONFIGS = [p for p in ALL_YAML if not _is_grid(p)]
GRIDS = [p for p in ALL_YAML if _is_grid(p)]


def test_defaults_are_valid():
    cfg = load_config()
    assert isinstance(cfg, RunConfig)
    assert cfg.model.preset == "tiny"


def test_yaml_and_overrides_merge(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("rollout:\n  temperature: 0.7\nmodel:\n  preset: test\n")
    cfg = load_config(path, ["rollout.top_k=5", "speculative.strategies=['2_1_3','8_4_48']"])
    assert (cfg.rollout.temperature, cfg.rollout.top_k, cfg.model.preset) == (0.7, 5, "test")
    assert cfg.speculative.strategies == ["2_1_3", "8_4_48"]


def test_round_trip_through_yaml(tmp_path):
    cfg = load_config(None, ["grpo.lr=0.001"])
    path = tmp_path / "dump.yaml"
    path.write_text(to_yaml(cfg))
    assert load_config(path) == cfg


@pytest.mark.parametrize(
    ("override", "fragment"),
    [
        ("rollout.nope=1", "unknown config key 'rollout.nope'"),
        ("nosection.x=1", "unknown config key 'nosection'"),
        ("rollout.temperature=warm", "rollout.temperature"),
        ("rollout.max_new_tokens=many", "rollout.max_new_tokens"),
        ("rollout.top_p=1.5", "rollout.top_p: got 1.5; allowed: a float in (0, 1]"),
        ("rollout.backend=tgi", "rollout.backend: got 'tgi'; allowed: one of native, vllm, sglang"),
        ("model.preset=huge", "model.preset"),
        ("speculative.strategies=['8_4']", "invalid SD strategy '8_4'"),
        ("speculative.strategies=['2_1_9']", "exceeds the 3 nodes"),
        ("speculative.strategies=[8_4_48]", "quote it"),
        ("speculative.tuner=magic", "speculative.tuner"),
        ("data.weights=[1.0]", "data.weights"),
        ("rollout.max_seq_len=100", "rollout.max_seq_len"),
        ("grpo.minibatch_size=0", "grpo.minibatch_size: got 0; allowed: an integer >= 1"),
        ("grpo.epochs=0", "grpo.epochs"),
        ("grpo.max_grad_norm=0", "grpo.max_grad_norm"),
        ("grpo.precision=fp16", "grpo.precision: got 'fp16'; allowed: one of 32-true, bf16-mixed"),
        ("drafter.precision=bf16", "drafter.precision: got 'bf16'; allowed: one of 32-true, bf16-mixed"),
        ("no_equals_sign", "key=value"),
    ],
)
def test_bad_config_names_the_key(override, fragment):
    with pytest.raises(ConfigError) as err:
        load_config(None, [override])
    assert fragment in str(err.value)


def test_missing_config_file(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "absent.yaml")


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_every_shipped_config_parses(path):
    assert isinstance(load_config(path), RunConfig)


@pytest.mark.parametrize("path", GRIDS, ids=[p.name for p in GRIDS])
def test_every_shipped_grid_expands_and_validates(path):
    from tlt.eval.sweep import validate
    from tlt.eval.sweep_grid import load_grid

    grid = load_grid(path)
    configs = validate(grid)
    assert len(configs) == len(grid.cells) > 0
    assert all(isinstance(cfg, RunConfig) for cfg in configs.values())


def test_configs_exist():
    assert CONFIGS, "configs/ must ship at least the quickstart preset"


def test_rl_configs_differ_only_in_tlt():
    from tlt.training.checkpoint import config_changes

    root = Path(__file__).parents[1] / "configs"
    baseline, tlt = load_config(root / "baseline.yaml"), load_config(root / "tlt.yaml")
    assert (baseline.speculative.enabled, baseline.scheduler.policy) == (False, "never")
    assert (tlt.speculative.enabled, tlt.speculative.tuner, tlt.drafter.kind, tlt.scheduler.policy) == (
        True,
        "cost",
        "eagle",
        "spot",
    )
    assert config_changes(baseline, tlt) == ["scheduler.policy", "speculative.enabled"]


def test_the_gpu_preset_passes_the_checks_of_an_8_rank_run():
    from tlt.training.distributed.data_parallel import check_world
    from tlt.training.rl_loop import check_rl_config

    cfg = load_config(Path(__file__).parents[1] / "configs" / "gpu_qwen2.5_7b.yaml")
    check_rl_config(cfg)
    check_world(cfg, 8)
    assert cfg.train.sharding == "fsdp" and cfg.rollout.backend == "vllm" and cfg.rollout.engine_args


def test_the_readme_config_example_loads(tmp_path):
    text = (Path(__file__).parents[1] / "README.md").read_text()
    example = text.split("```yaml\n# configs/my_run.yaml", 1)[1].split("\n", 1)[1].split("```", 1)[0]
    (tmp_path / "my_run.yaml").write_text(example)
    cfg = load_config(tmp_path / "my_run.yaml")
    assert cfg.model.preset == "deep" and cfg.speculative.strategies == ["3_1_4", "5_1_6", "7_1_8"]
    assert cfg.drafter.online_lr == 1e-4 and Path(cfg.model.path).is_dir()
