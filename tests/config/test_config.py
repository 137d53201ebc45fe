"""Config loading, validation messages and overrides."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from transformer_mt.config import Config, ConfigError, from_dict, load_config, save_config, to_dict

REPO = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "x.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_defaults_are_the_paper_base_model():
    cfg = load_config(None)
    m = cfg.model
    assert (m.encoder_layers, m.decoder_layers, m.d_model, m.d_ff, m.heads, m.dropout) == (6, 6, 512, 2048, 8, 0.1)
    assert (
        cfg.train.label_smoothing == 0.1
        and cfg.train.optimizer_betas == (0.9, 0.98)
        and cfg.train.optimizer_eps == 1e-9
    )
    assert (
        cfg.train.warmup_updates == 4000
        and cfg.decode.beam == 4
        and cfg.decode.lenpen == 0.6
        and cfg.decode.max_len_b == 50
    )


def test_shipped_configs_load_with_paper_sizes():
    base = load_config(REPO / "configs/transformer_base.yaml", check_files=False)
    big = load_config(REPO / "configs/transformer_big.yaml", check_files=False)
    assert (base.model.d_model, base.model.d_ff, base.model.heads, base.model.dropout) == (512, 2048, 8, 0.1)
    assert (big.model.d_model, big.model.d_ff, big.model.heads, big.model.dropout) == (1024, 4096, 16, 0.3)
    for path in sorted((REPO / "configs").glob("*.yaml")):
        load_config(path, check_files=False)


def test_yaml_values_are_loaded_and_typed(tmp_path):
    path = write(
        tmp_path,
        "model:\n  d_model: 256\n  heads: 4\n  norm: pre\ntrain:\n  lr: 7e-4\n  optimizer_betas: [0.9, 0.997]\n",
    )
    cfg = load_config(path)
    assert cfg.model.d_model == 256 and cfg.model.norm == "pre"
    assert cfg.train.lr == pytest.approx(7e-4) and cfg.train.optimizer_betas == (0.9, 0.997)


def test_unknown_key_names_key_file_and_closest(tmp_path):
    path = write(tmp_path, "model:\n  d_modle: 256\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    msg = str(err.value)
    assert str(path) in msg and "model.d_modle" in msg and "did you mean 'd_model'" in msg


def test_unknown_section_suggests(tmp_path):
    with pytest.raises(ConfigError, match="unknown section 'trian'; did you mean 'train'"):
        load_config(write(tmp_path, "trian:\n  lr: 1\n"))


def test_wrong_type(tmp_path):
    with pytest.raises(ConfigError, match=r"model\.heads: expected an integer, got 'eight'"):
        load_config(write(tmp_path, "model:\n  heads: eight\n"))
    with pytest.raises(ConfigError, match=r"model\.heads: expected an integer, got 2\.5"):
        load_config(write(tmp_path, "model:\n  heads: 2.5\n"))


def test_d_model_not_divisible_by_heads(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, "model:\n  d_model: 500\n  heads: 8\n"))
    assert "500 is not divisible by model.heads=8" in str(err.value) and "multiple of heads" in str(err.value)


def test_dropout_outside_unit_interval(tmp_path):
    with pytest.raises(ConfigError, match=r"model\.dropout: 1\.0 is outside \[0, 1\)"):
        load_config(write(tmp_path, "model:\n  dropout: 1.0\n"))
    with pytest.raises(ConfigError, match=r"train\.label_smoothing: -0\.1 is outside"):
        load_config(write(tmp_path, "train:\n  label_smoothing: -0.1\n"))


def test_bad_choice(tmp_path):
    with pytest.raises(ConfigError, match=r"model\.norm: 'middle' is not one of post, pre"):
        load_config(write(tmp_path, "model:\n  norm: middle\n"))


def test_model_options_for_converted_checkpoints(tmp_path):
    """model.activation swish, model.position_layout and model.output_bias: defaults as before,
    bad values in one line."""
    default = load_config(None, check_files=False).model
    assert (default.activation, default.position_layout, default.output_bias) == ("relu", "interleaved", False)
    cfg = load_config(write(tmp_path, "model:\n  activation: swish\n  position_layout: halves\n  output_bias: true\n"))
    assert (cfg.model.activation, cfg.model.position_layout, cfg.model.output_bias) == ("swish", "halves", True)
    for text, message in (
        ("model:\n  activation: silu\n", r"model\.activation: 'silu' is not one of relu, gelu, swish$"),
        (
            "model:\n  position_layout: split\n",
            r"model\.position_layout: 'split' is not one of interleaved, halves, fairseq$",
        ),
        ("model:\n  output_bias: maybe\n", r"model\.output_bias: .*'maybe'"),
        (
            "model:\n  positions: learned\n  position_layout: halves\n",
            r"model\.position_layout: 'halves' orders sinusoids only; .*sinusoidal$",
        ),
    ):
        with pytest.raises(ConfigError, match=message) as err:
            load_config(write(tmp_path, text))
        assert "\n" not in str(err.value)


def test_keep_every_must_fall_on_numbered_checkpoints(tmp_path):
    # numbered checkpoints come every save_every updates (every validate_every when save_every is 0); a keep_every
    # between them would keep only the common multiples, so it is refused
    with pytest.raises(
        ConfigError, match=r"train\.keep_every: 1100 is not a multiple of train\.save_every \(250\).*e\.g\. 1000"
    ):
        load_config(write(tmp_path, "train:\n  save_every: 250\n  keep_every: 1100\n"))
    with pytest.raises(
        ConfigError, match=r"train\.keep_every: 1500 is not a multiple of train\.validate_every \(1000\)"
    ):
        load_config(write(tmp_path, "train:\n  validate_every: 1000\n  keep_every: 1500\n"))
    assert load_config(write(tmp_path, "train:\n  save_every: 250\n  keep_every: 1000\n")).train.keep_every == 1000


def test_which_updates_write_numbered_checkpoints():
    # save_every 0: every validation writes one, the final validation too (at whatever update the budget ended)
    t = Config().train
    t.validate_every, t.save_every = 500, 0
    assert t.numbered_spacing == 500
    assert t.writes_numbered(1234, validating=True) and not t.writes_numbered(1000, validating=False)
    # save_every 250: multiples of 250 only, between validations or at them;
    # an off-multiple final validation writes none
    t.save_every = 250
    assert t.numbered_spacing == 250
    assert t.writes_numbered(750, validating=False) and t.writes_numbered(1000, validating=True)
    assert not t.writes_numbered(1234, validating=True) and not t.writes_numbered(1001, validating=False)


def test_linear_schedule_needs_max_updates_above_warmup(tmp_path):
    with pytest.raises(
        ConfigError,
        match=r"train\.max_updates: lr_schedule linear decays to 0 at max_updates.*max_updates=0, warmup_updates=4000",
    ):
        load_config(write(tmp_path, "train:\n  lr_schedule: linear\n"))
    assert (
        load_config(write(tmp_path, "train:\n  lr_schedule: linear\n  max_updates: 5000\n")).train.max_updates == 5000
    )


def test_subword_sampling_settings_are_checked(tmp_path):
    with pytest.raises(ConfigError, match=r"x\.yaml: data\.subword_alpha: 1\.5 is outside \[0, 1\]; use 0 \(off\)"):
        load_config(write(tmp_path, "data:\n  subword_alpha: 1.5\n"))
    with pytest.raises(ConfigError, match=r"data\.subword_nbest: 1 samples nothing; use -1"):
        load_config(write(tmp_path, "data:\n  subword_alpha: 0.3\n  subword_nbest: 1\n"))
    cfg = load_config(write(tmp_path, "data:\n  subword_alpha: 0.3\n  subword_nbest: 64\n"))
    assert (cfg.data.subword_alpha, cfg.data.subword_nbest) == (0.3, 64)


def test_missing_data_file(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, "data:\n  train_src: nowhere/train.en\n"))
    assert "data.train_src" in str(err.value) and "nowhere/train.en" in str(err.value) and "not found" in str(err.value)


def test_missing_config_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match="line 3 is not valid YAML"):
        load_config(write(tmp_path, "model:\n  d_model: 256\n    heads: 4\n"))


def test_share_all_needs_joint_vocab(tmp_path):
    with pytest.raises(ConfigError, match="share_all_embeddings: needs a joint vocabulary"):
        load_config(write(tmp_path, "tokenizer:\n  joint: false\n"))


def test_overrides_apply_and_validate(tmp_path):
    path = write(tmp_path, "model:\n  d_model: 256\n  heads: 4\n")
    cfg = load_config(
        path, ["model.encoder_layers=3", "train.lr=7e-4", "model.norm=pre", "train.optimizer_betas=[0.9, 0.99]"]
    )
    assert cfg.model.encoder_layers == 3 and cfg.train.lr == pytest.approx(7e-4) and cfg.model.norm == "pre"
    assert cfg.train.optimizer_betas == (0.9, 0.99)
    with pytest.raises(ConfigError, match=r"--set model\.layer: unknown key 'model\.layer'; did you mean"):
        load_config(path, ["model.layer=3"])
    with pytest.raises(ConfigError, match="expected section.key=value"):
        load_config(path, ["layers3"])
    with pytest.raises(ConfigError, match="not divisible"):
        load_config(path, ["model.heads=3"])


def test_round_trip_through_yaml_and_dict(tmp_path):
    cfg = load_config(None, ["model.d_model=256", "model.heads=4", "train.seed=7"])
    save_config(cfg, tmp_path / "config.yaml")
    again = load_config(tmp_path / "config.yaml")
    assert again == cfg
    assert from_dict(yaml.safe_load(yaml.safe_dump(to_dict(cfg)))) == cfg
    assert isinstance(Config().model.d_model, int)


# ---------------------------------------------------------------- files nobody here wrote: one short line,
# never a traceback
def refusal(call) -> str:
    """The message of the ConfigError `call()` raises, checked to be one short line."""
    with pytest.raises(ConfigError) as err:
        call()
    msg = str(err.value)
    assert "\n" not in msg and len(msg) < 400, msg[:500]
    return msg


def test_numbers_too_long_for_python_are_refused_in_one_line(tmp_path):
    msg = refusal(lambda: load_config(write(tmp_path, f"model:\n  d_model: {'9' * 5000}\n")))
    assert "x.yaml" in msg and "line 2" in msg
    msg = refusal(lambda: from_dict({"model": {"dropout": 10**400}}, source="ckpt.pt"))  # float() overflows
    assert "ckpt.pt" in msg and "model.dropout" in msg
    msg = refusal(lambda: from_dict({"model": {"d_model": 10**5000}}, source="ckpt.pt"))  # str() of it would raise
    assert "ckpt.pt" in msg and "model.d_model" in msg
    # hexadecimal has no digit limit in int(), but str() of the result has
    msg = refusal(lambda: load_config(write(tmp_path, f"data:\n  train_src: 0x{'f' * 5000}\n")))
    assert "x.yaml" in msg and "data.train_src" in msg
    msg = refusal(lambda: load_config(write(tmp_path, "data:\n  train_src: 2001-13-45\n")))  # no 13th month
    assert "x.yaml" in msg and "line 2" in msg


def test_integers_are_not_rounded_through_float(tmp_path):
    msg = refusal(lambda: load_config(write(tmp_path, "model:\n  d_model: 99999999999999999999999\n")))
    assert "99999999999999999999999" in msg


def test_deeply_nested_yaml_is_refused_in_one_line(tmp_path):
    msg = refusal(lambda: load_config(write(tmp_path, "model:\n  d_model: " + "[" * 50_000 + "]" * 50_000 + "\n")))
    assert "x.yaml" in msg and "nested" in msg


def test_alias_bomb_is_refused_without_expanding_it(tmp_path):
    # 9**6 references to one list: a few hundred bytes of YAML, a repr of millions of characters
    doc = "model:\n  d_model: [&a0 [x, x, x, x, x, x, x, x, x]"
    for i in range(1, 7):
        doc += f", &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]"
    msg = refusal(lambda: load_config(write(tmp_path, doc + "]\n")))
    assert "model.d_model" in msg and "expected an integer" in msg


def test_unhashable_yaml_key_is_refused_in_one_line(tmp_path):
    msg = refusal(lambda: load_config(write(tmp_path, "model:\n  ? [1, 2]\n  : 3\n")))
    assert "x.yaml" in msg and "line 2" in msg


def test_long_or_multiline_values_are_quoted_short(tmp_path):
    msg = refusal(lambda: load_config(write(tmp_path, f"model:\n  activation: {'x' * 10_000}\n")))
    assert "model.activation" in msg and "xxx" in msg
    msg = refusal(lambda: load_config(write(tmp_path, 'data:\n  train_src: "no\\nsuch\\nfile"\n')))
    assert "data.train_src" in msg and "not found" in msg


def test_checkpoint_config_sections_and_keys_are_checked(tmp_path):
    for raw, key in (
        ({"model": None}, "model"),
        ({"model": [1, 2]}, "model"),
        ({"model": "d_model"}, "model"),
        ({5: {"d_model": 8}}, "5"),
        ({"model": {5: 1}}, "model.5"),
        ({"model": {("a",): 1}}, "model"),
        ({"train": {"optimizer_betas": "[" * 50_000}}, "train.optimizer_betas"),
        ({"train": {"optimizer_betas": "&a [*a]"}}, "train.optimizer_betas"),
        ({"data": {"train_src": b"bytes"}}, "data.train_src"),
        ({"model": {"activation": ["relu"]}}, "model.activation"),
    ):
        msg = refusal(lambda raw=raw: from_dict(raw, source="ckpt.pt"))
        assert msg.startswith("ckpt.pt: ") and key in msg, (raw, msg)
    with pytest.raises(ConfigError, match="expected a mapping of sections"):
        from_dict([1], source="ckpt.pt")  # type: ignore[arg-type]


def test_betas_override_still_reads_a_comma_list():
    assert load_config(None, ["train.optimizer_betas=0.9,0.99"]).train.optimizer_betas == (0.9, 0.99)
    assert load_config(None, ["train.optimizer_betas=[0.8, 0.9]"]).train.optimizer_betas == (0.8, 0.9)


def test_a_model_too_large_for_memory_is_refused(tmp_path):
    # about 5e10 parameters (200 GB of float32): each size within its own limit, the product is not
    path = write(tmp_path, "model:\n  d_model: 16384\n  heads: 16\n  d_ff: 65536\n")
    msg = refusal(lambda: load_config(path))
    assert "x.yaml" in msg and "parameters" in msg and "GiB" in msg


@pytest.mark.parametrize(
    "override",
    [
        "data.max_len_ratio=0.5",
        "model.value_dim=-1",
        "train.lr_scale=0",
        "train.lr=-1",
        "model.head_dim=-2",
        "data.max_len=0",
    ],
)
def test_an_impossible_value_is_refused_under_its_own_key(override):
    key = override.split("=")[0]
    with pytest.raises(ConfigError, match=rf"^config: {re.escape(key)}: "):
        load_config(None, [override])
