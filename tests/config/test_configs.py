"""RF configs: knobs in fields, read-back of what the user wrote, parity with TRL, parsing."""

from __future__ import annotations

import dataclasses
import warnings

import pytest
import yaml
from trl import DPOConfig, GRPOConfig, SFTConfig, TrlParser

from trl_rapidfire import (
    GridSearch,
    List,
    Range,
    RFConfigError,
    RFDPOConfig,
    RFGRPOConfig,
    RFSFTConfig,
)
from trl_rapidfire.config.configs import normalize_fsdp_config

GENERATION_FIELDS = {"generation_config", "generation_eval_rows", "generation_saved_rows"}
RF_ONLY = {"num_chunks", "warmup_ratio", "cache_budget_bytes", "clone_overrides",
           "checkpoint_every", "stop_diverged", *GENERATION_FIELDS}
DPO_REMOVED = {
    "max_prompt_length", "max_completion_length", "model_adapter_name", "ref_adapter_name",
    "force_use_ref_model",
}


@pytest.fixture
def cpu(tmp_path):
    return dict(output_dir=str(tmp_path / "out"), use_cpu=True, bf16=False, report_to="none")


# ---- reading back what the user wrote ------------------------------------------------------


def test_knobs_and_chunk_strategies_read_back(cpu):
    lr = List([2e-4, 1e-5])
    cfg = RFSFTConfig(**cpu, learning_rate=lr, lr_scheduler_type=List(["linear", "cosine"]),
                      eval_strategy="chunk", save_strategy="chunk", num_chunks=3)
    assert cfg.learning_rate is lr
    assert cfg.eval_strategy == "chunk" and cfg.save_strategy == "chunk"
    assert cfg.eval_strategy != "no"  # scripts that test this still pass an eval set
    assert cfg.do_eval is True
    assert cfg.num_chunks == 3
    assert list(cfg.knobs) == ["learning_rate", "lr_scheduler_type"]
    assert isinstance(cfg, SFTConfig)


def test_concrete_config_is_the_trl_parent_with_chunk_translated(cpu):
    cfg = RFSFTConfig(**cpu, learning_rate=List([2e-4, 1e-5]), eval_strategy="chunk",
                      save_strategy="chunk", num_chunks=2)
    concrete = cfg.concrete_config({"learning_rate": 1e-5})
    assert type(concrete) is SFTConfig
    assert concrete.learning_rate == 1e-5
    assert concrete.eval_strategy == "no" and concrete.save_strategy == "no"
    assert not hasattr(concrete, "num_chunks")
    with pytest.raises(RFConfigError, match="learning_rate"):
        cfg.concrete_config({})


@pytest.mark.parametrize(
    ("rf_class", "trl_class", "extra"),
    [
        (RFSFTConfig, SFTConfig, {"max_length": 256, "packing": True}),
        (RFDPOConfig, DPOConfig, {"beta": 0.2, "loss_type": ["sigmoid", "sft"]}),
        (RFGRPOConfig, GRPOConfig, {"num_generations": 4, "per_device_train_batch_size": 4}),
    ],
)
def test_without_knobs_an_rf_config_equals_its_trl_parent(cpu, rf_class, trl_class, extra):
    kwargs = dict(cpu, learning_rate=3e-4, lr_scheduler_type="cosine", logging_steps=3, **extra)
    rf_dict = rf_class(**kwargs).to_dict()
    trl_dict = trl_class(**kwargs).to_dict()
    own = RF_ONLY | (DPO_REMOVED if rf_class is RFDPOConfig else set())
    own |= {"max_prompt_length"} if rf_class is RFGRPOConfig else set()
    own -= GENERATION_FIELDS if rf_class is RFGRPOConfig else set()  # GRPO generates itself
    assert set(rf_dict) - set(trl_dict) == own
    assert {k: v for k, v in rf_dict.items() if k not in own} == trl_dict
    assert rf_class(**kwargs).concrete_config().to_dict() == trl_dict


@pytest.mark.parametrize(
    "bad",
    [{"lr_scheduler_type": "bogus"}, {"logging_steps": 0, "logging_strategy": "steps"},
     {"fp16": True, "bf16": True}, {"warmup_steps": -1}],
)
def test_same_validation_errors_as_trl(cpu, bad):
    kwargs = {**cpu, **bad}
    with pytest.raises(ValueError) as trl_err:
        SFTConfig(**kwargs)
    with pytest.raises(ValueError) as rf_err:
        RFSFTConfig(**kwargs)
    assert str(rf_err.value) == str(trl_err.value)


def test_unknown_field_is_reported_as_trl_reports_it(cpu):
    with pytest.raises(TypeError, match="unexpected keyword argument 'learning_rat'"):
        RFSFTConfig(**cpu, learning_rat=1e-4)


def test_bad_first_candidate_fails_at_construction_naming_the_knob(cpu):
    with pytest.raises(ValueError, match="bogus.*first value of each knob: lr_scheduler_type"):
        RFSFTConfig(**cpu, lr_scheduler_type=List(["bogus", "linear"]))


# ---- bad input --------------------------------------------------------------------------------


def test_plain_list_on_a_scalar_field_points_to_List(cpu):
    with pytest.raises(RFConfigError, match=r"learning_rate=List\(\[0.0001, 0.001\]\)"):
        RFSFTConfig(**cpu, learning_rate=[1e-4, 1e-3])


def test_plain_list_on_a_list_field_is_a_value(cpu):
    cfg = RFDPOConfig(**cpu, loss_type=["sigmoid", "sft"], loss_weights=[1.0, 0.5])
    assert cfg.knobs == {}
    assert cfg.concrete_config().loss_type == ["sigmoid", "sft"]


@pytest.mark.parametrize("chunks", [0, -1, 1.5, True, "4"])
def test_num_chunks_must_be_a_positive_int(cpu, chunks):
    with pytest.raises(RFConfigError, match="num_chunks"):
        RFSFTConfig(**cpu, num_chunks=chunks)


@pytest.mark.parametrize("field", ["output_dir", "num_chunks"])
def test_experiment_fields_cannot_be_knobs(cpu, field):
    kwargs = dict(cpu)
    kwargs[field] = List(["a", "b"]) if field == "output_dir" else List([2, 4])
    with pytest.raises(RFConfigError, match=f"`{field}`.*cannot be a knob"):
        RFSFTConfig(**kwargs)


# One value of each experiment-wide field that would be valid alone.
_WIDE_VALUES = {"output_dir": ["a", "b"], "num_chunks": [2, 4], "cache_budget_bytes": [0, 1 << 20],
                "clone_overrides": [["learning_rate"], ["weight_decay"]],
                "checkpoint_every": ["chunk", 60], "stop_diverged": [True, False]}


def test_every_experiment_wide_field_of_the_one_table_is_refused_as_a_knob(cpu):
    from trl_rapidfire.config.fields import EXPERIMENT_WIDE

    assert set(_WIDE_VALUES) == EXPERIMENT_WIDE  # a field added to the table is tested here
    for field, values in _WIDE_VALUES.items():
        with pytest.raises(RFConfigError, match=f"`{field}`.*cannot be a knob"):
            RFSFTConfig(**{**cpu, field: List(values)})


@pytest.mark.parametrize("field", ["lr_scheduler_type", "packing", "bf16"])
def test_range_on_a_non_numeric_field_is_an_error(cpu, field):
    with pytest.raises(RFConfigError, match=f"{field}.*List"):
        RFSFTConfig(**{**cpu, field: Range(0, 1)})


def test_range_on_numeric_fields_is_accepted(cpu):
    cfg = RFSFTConfig(**cpu, learning_rate=Range(1e-5, 1e-3), warmup_steps=Range(0.0, 0.2),
                      per_device_train_batch_size=Range(2, 8, dtype=int))
    assert set(cfg.knobs) == {"learning_rate", "warmup_steps", "per_device_train_batch_size"}


# ---- warmup_ratio (removed in transformers 5) --------------------------------------------------


def test_warmup_ratio_becomes_warmup_steps_with_a_warning(cpu):
    with pytest.warns(FutureWarning, match="warmup_ratio"):
        cfg = RFSFTConfig(**cpu, warmup_ratio=0.1)
    assert cfg.warmup_ratio == 0.1 and cfg.warmup_steps == 0
    concrete = cfg.concrete_config()
    assert concrete.warmup_steps == 0.1
    reference = SFTConfig(**cpu, warmup_steps=0.1)
    assert concrete.get_warmup_steps(100) == reference.get_warmup_steps(100) == 10


def test_warmup_ratio_as_a_knob(cpu):
    with pytest.warns(FutureWarning):
        cfg = RFSFTConfig(**cpu, warmup_ratio=List([0.0, 0.2]))
    runs = GridSearch().expand(cfg)
    assert [r.config.warmup_steps for r in runs] == [0.0, 0.2]


@pytest.mark.parametrize(("ratio", "steps"), [(1.0, 0), (-0.1, 0), (0.1, 5)])
def test_bad_warmup_ratio(cpu, ratio, steps):
    with pytest.raises(RFConfigError, match="warmup"):
        RFSFTConfig(**cpu, warmup_ratio=ratio, warmup_steps=steps)


# ---- options TRL removed since the seed's examples ---------------------------------------------


@pytest.mark.parametrize(
    ("option", "value", "replacement"),
    [
        ("max_prompt_length", 1024, "max_length"),
        ("max_completion_length", 1024, "max_length"),
        ("model_adapter_name", "policy", "active adapter"),
        ("ref_adapter_name", "reference", "ref_model"),
        ("force_use_ref_model", True, "ref_model"),
    ],
)
def test_removed_dpo_options_name_their_replacement(cpu, option, value, replacement):
    with pytest.raises(RFConfigError, match=f"{option}.*{replacement}"):
        RFDPOConfig(**cpu, **{option: value})


@pytest.mark.parametrize(("option", "value"), [("model_adapter_name", "default"),
                                               ("force_use_ref_model", False)])
def test_removed_dpo_options_with_todays_meaning_warn(cpu, option, value):
    with pytest.warns(FutureWarning, match=option):
        cfg = RFDPOConfig(**cpu, **{option: value})
    assert not hasattr(cfg.concrete_config(), option)


def test_removed_grpo_max_prompt_length(cpu):
    with pytest.raises(RFConfigError, match="max_prompt_length"):
        RFGRPOConfig(**cpu, per_device_train_batch_size=4, num_generations=4, max_prompt_length=512)


# ---- fsdp_config keys -------------------------------------------------------------------------


def test_fsdp_offload_params_is_mapped_never_dropped():
    with pytest.warns(FutureWarning, match="offload_params.*cpu_offload"):
        cfg = normalize_fsdp_config({"offload_params": True, "sharding_strategy": "FULL_SHARD"})
    assert cfg["cpu_offload"] is True and "offload_params" not in cfg
    assert cfg["reshard_after_forward"] is True


def test_fsdp_contradictions_and_fsdp1_only_strategies_are_errors():
    with pytest.raises(RFConfigError, match="offload_params.*cpu_offload"):
        normalize_fsdp_config({"offload_params": True, "cpu_offload": False})
    with pytest.raises(RFConfigError, match="HYBRID_SHARD.*FSDP1"):
        normalize_fsdp_config({"sharding_strategy": "HYBRID_SHARD"})
    with pytest.warns(UserWarning, match="only affect FSDP1"):
        normalize_fsdp_config({"use_orig_params": False})
    with pytest.warns(UserWarning, match="not read by transformers"):
        normalize_fsdp_config({"cpu_offlaod": True})


def test_fsdp_config_reaches_the_concrete_config_mapped(cpu):
    with pytest.warns(FutureWarning, match="offload_params"):
        cfg = RFSFTConfig(**cpu, fsdp="full_shard auto_wrap",
                          fsdp_config={"offload_params": True, "auto_wrap_policy":
                                       "TRANSFORMER_BASED_WRAP"})
    concrete = cfg.concrete_config()
    assert concrete.fsdp_config["cpu_offload"] is True
    assert concrete.fsdp_plugin_args["cpu_offload"] is True


# ---- the seed's example configs ---------------------------------------------------------------

GPU_ONLY_OFF = {"fp16": False, "bf16": False, "use_cpu": True}


def test_seed_sft_examples_construct(tmp_path):
    common = dict(
        output_dir=str(tmp_path), learning_rate=2e-4, lr_scheduler_type="linear",
        per_device_train_batch_size=4, per_device_eval_batch_size=8,
        gradient_accumulation_steps=4, num_train_epochs=2, logging_steps=5,
        eval_strategy="steps", eval_steps=25, fp16=True, save_strategy="epoch",
    )
    RFSFTConfig(**{**common, **GPU_ONLY_OFF})
    multi = {**common, "learning_rate": List([2e-4, 1e-5]),
             "lr_scheduler_type": List(["linear", "cosine"])}
    assert len(GridSearch().expand(RFSFTConfig(**{**multi, **GPU_ONLY_OFF}))) == 4
    fsdp_large = {
        "backward_prefetch": "backward_pre", "forward_prefetch": False, "use_orig_params": False,
        "cpu_ram_efficient_loading": True, "offload_params": False, "sync_module_states": True,
        "limit_all_gathers": True, "sharding_strategy": "FULL_SHARD",
        "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
    }
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cfg = RFSFTConfig(**{**common, **GPU_ONLY_OFF}, fsdp="full_shard auto_wrap",
                          fsdp_config=fsdp_large)
    messages = " ".join(str(w.message) for w in caught)
    assert "offload_params" in messages and "only affect FSDP1" in messages
    assert cfg.concrete_config().fsdp_plugin_args.get("cpu_offload", False) is False


def test_seed_dpo_example_constructs_once_removed_options_go(tmp_path):
    seed = dict(
        output_dir=str(tmp_path), model_adapter_name="default", ref_adapter_name="reference",
        force_use_ref_model=False, loss_type="sigmoid", beta=List([0.1, 0.001]),
        max_prompt_length=1024, max_completion_length=1024, max_length=2048,
        per_device_train_batch_size=2, gradient_accumulation_steps=4, learning_rate=5e-6,
        warmup_ratio=0.1, weight_decay=0, lr_scheduler_type="linear", optim="adamw_8bit",
        num_train_epochs=1, logging_strategy="steps", logging_steps=1, bf16=True,
        save_strategy="epoch",
    )
    with pytest.raises(RFConfigError, match="ref_adapter_name|max_prompt_length"):
        RFDPOConfig(**{**seed, **GPU_ONLY_OFF})
    for option in ("ref_adapter_name", "max_prompt_length", "max_completion_length"):
        seed.pop(option)
    with pytest.warns(FutureWarning):
        cfg = RFDPOConfig(**{**seed, **GPU_ONLY_OFF})
    runs = GridSearch().expand(cfg)
    assert [r.config.beta for r in runs] == [0.1, 0.001]
    assert all(r.config.warmup_steps == 0.1 for r in runs)


def test_seed_grpo_example_constructs_once_removed_options_go(tmp_path):
    seed = dict(
        output_dir=str(tmp_path), learning_rate=5e-6, warmup_ratio=0.1, weight_decay=0.1,
        max_grad_norm=0.1, adam_beta1=0.9, adam_beta2=0.99, lr_scheduler_type="linear",
        per_device_train_batch_size=4, gradient_accumulation_steps=4, num_generations=8,
        optim="adamw_8bit", num_train_epochs=2, max_prompt_length=1024,
        max_completion_length=1024, logging_steps=2, eval_steps=5,
    )
    with pytest.raises(RFConfigError, match="max_prompt_length"):
        RFGRPOConfig(**{**seed, **GPU_ONLY_OFF})
    seed.pop("max_prompt_length")
    with pytest.warns(FutureWarning):
        cfg = RFGRPOConfig(**{**seed, **GPU_ONLY_OFF})
    assert cfg.concrete_config().generation_batch_size == 16


# ---- TrlParser: YAML and flags ----------------------------------------------------------------


def _parse(config_class, args):
    return TrlParser(dataclass_types=[config_class]).parse_args_and_config(args)[0]


def test_trlparser_yaml_round_trip_with_knobs_and_chunk(tmp_path):
    direct = RFSFTConfig(
        output_dir=str(tmp_path / "o"), learning_rate=List([1e-4, 3e-4]),
        warmup_steps=Range(0.0, 0.2), eval_strategy="chunk", save_strategy="chunk",
        num_chunks=3, use_cpu=True, bf16=False, report_to="none",
    )
    written = {k: direct.to_dict()[k] for k in (
        "output_dir", "learning_rate", "warmup_steps", "eval_strategy", "save_strategy",
        "num_chunks", "use_cpu", "bf16", "report_to")}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(written))
    parsed = _parse(RFSFTConfig, ["--config", str(path)])
    assert parsed.learning_rate == List([1e-4, 3e-4])
    assert parsed.warmup_steps == Range(0.0, 0.2)
    assert parsed.eval_strategy == "chunk" and parsed.save_strategy == "chunk"
    assert parsed.to_dict() == direct.to_dict()


def test_trlparser_flags_including_chunk(tmp_path):
    parsed = _parse(RFDPOConfig, [
        "--output_dir", str(tmp_path), "--save_strategy", "chunk", "--eval_strategy", "chunk",
        "--num_chunks", "5", "--beta", "0.3", "--use_cpu", "--bf16", "false",
        "--report_to", "none",
    ])
    direct = RFDPOConfig(output_dir=str(tmp_path), save_strategy="chunk", eval_strategy="chunk",
                         num_chunks=5, beta=0.3, use_cpu=True, bf16=False, report_to="none")
    assert parsed.save_strategy == "chunk" and parsed.num_chunks == 5
    assert parsed.to_dict() == direct.to_dict()


def test_trlparser_rejects_an_unknown_strategy(tmp_path, capsys):
    with pytest.raises(SystemExit):
        _parse(RFSFTConfig, ["--output_dir", str(tmp_path), "--save_strategy", "chunks"])
    assert "invalid choice" in capsys.readouterr().err


def test_dataclass_fields_are_those_of_the_parent_plus_ours():
    rf = {f.name for f in dataclasses.fields(RFSFTConfig)}
    trl = {f.name for f in dataclasses.fields(SFTConfig)}
    assert rf - trl == RF_ONLY and trl <= rf


def test_replace_deepcopy_and_pickle_keep_what_the_user_wrote(cpu):
    import copy
    import pickle

    with pytest.warns(FutureWarning):
        cfg = RFSFTConfig(**cpu, learning_rate=List([1e-4, 3e-4]), eval_strategy="chunk",
                          warmup_ratio=0.1, num_chunks=3)
    with pytest.warns(FutureWarning):
        changed = dataclasses.replace(cfg, learning_rate=List([5e-4, 1e-3]))
    assert changed.learning_rate == List([5e-4, 1e-3]) and changed.eval_strategy == "chunk"
    assert changed.warmup_ratio == 0.1 and changed.num_chunks == 3
    assert [r.config.learning_rate for r in GridSearch().expand(changed)] == [5e-4, 1e-3]
    for other in (copy.deepcopy(cfg), pickle.loads(pickle.dumps(cfg))):
        assert other.to_dict() == cfg.to_dict()
        assert other.concrete_config({"learning_rate": 3e-4}).to_dict() == \
            cfg.concrete_config({"learning_rate": 3e-4}).to_dict()


def test_fields_set_after_construction_reach_every_run(cpu):
    config = RFSFTConfig(learning_rate=List([1e-4, 1e-3]), **cpu)
    config.model_init_kwargs = {"dtype": "float32"}  # what TRL's sft.py does after parsing
    config.lr_scheduler_type = List(["linear", "cosine"])
    assert set(config.knobs) == {"learning_rate", "lr_scheduler_type"}
    run = config.concrete_config({"learning_rate": 1e-3, "lr_scheduler_type": "cosine"})
    assert run.model_init_kwargs == {"dtype": "float32"}
    assert run.lr_scheduler_type == "cosine"
    config.learning_rate = 5e-4  # no longer a knob
    assert set(config.knobs) == {"lr_scheduler_type"}
    assert config.concrete_config({"lr_scheduler_type": "linear"}).learning_rate == 5e-4


def test_every_candidate_of_an_fsdp_config_knob_is_mapped(cpu):
    from trl_rapidfire import List

    with pytest.warns(FutureWarning, match="offload_params"):
        cfg = RFSFTConfig(**cpu, fsdp="full_shard auto_wrap",
                          fsdp_config=List([{"offload_params": True},
                                            {"offload_params": False}]))
    plugin = [cfg.concrete_config({"fsdp_config": v}).fsdp_plugin_args.get("cpu_offload", False)
              for v in cfg.knobs["fsdp_config"].values]
    assert plugin == [True, False]
