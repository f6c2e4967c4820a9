import dataclasses

import pytest

from lmforge.config import apply_overrides, from_dict, load_json, parse_overrides, to_dict
from lmforge.errors import ConfigError
from lmforge.storage.files import save_json


@dataclasses.dataclass
class Cfg:
    hidden_size: int = 32
    dropout: float = 0.1
    norm_first: bool = False
    act: str = "gelu"
    widths: tuple[int, ...] = (1, 2, 3)
    limit: int | None = None

    def __post_init__(self):
        if self.hidden_size <= 0:
            raise ValueError("hidden_size must be positive")


def test_overrides_are_coerced_to_field_types():
    cfg = apply_overrides(Cfg(), ["hidden_size=64", "dropout=0", "norm_first=true", "widths=1,4", "limit=none"])
    assert cfg == Cfg(hidden_size=64, dropout=0.0, norm_first=True, widths=(1, 4), limit=None)
    assert apply_overrides(Cfg(), ["limit=7"]).limit == 7


def test_unknown_key_is_rejected_with_suggestion():
    with pytest.raises(ConfigError, match="unknown config key 'hiden_size'.*did you mean 'hidden_size'"):
        apply_overrides(Cfg(), ["hiden_size=3"])
    with pytest.raises(ConfigError, match="unknown config key 'nope'"):
        from_dict(Cfg, {"nope": 1})


def test_bad_values_are_config_errors():
    with pytest.raises(ConfigError, match="expects an integer"):
        apply_overrides(Cfg(), ["hidden_size=abc"])
    with pytest.raises(ConfigError, match="expects true/false"):
        apply_overrides(Cfg(), ["norm_first=maybe"])
    with pytest.raises(ConfigError, match="hidden_size must be positive"):
        apply_overrides(Cfg(), ["hidden_size=-1"])
    with pytest.raises(ConfigError, match="key=value"):
        parse_overrides(["oops"])


def test_json_round_trip_and_ignored_keys(tmp_path):
    cfg = Cfg(hidden_size=48, widths=(2, 5))
    save_json(cfg, tmp_path / "config.json", model_type="toy")
    data = load_json(tmp_path / "config.json")
    assert data["model_type"] == "toy" and list(data)[0] == "model_type"
    assert from_dict(Cfg, data, ignore=("model_type",)) == cfg
    assert to_dict(cfg)["widths"] == [2, 5]


def test_bad_json(tmp_path):
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_json(tmp_path / "bad.json")
    with pytest.raises(ConfigError, match="not found"):
        load_json(tmp_path / "missing.json")


def test_keys_of_earlier_development_get_the_ordinary_unknown_key_error():
    """lmforge has made no release: a key it once wrote (bf16, the masking recipe in a BERT config.json) is an
    unknown key like any other, answered with the valid keys."""
    from lmforge.families.bert.model import BertConfig
    from lmforge.families.electra.model import ElectraConfig
    from lmforge.train.config import TrainConfig

    with pytest.raises(ConfigError, match="unknown config key 'bf16' for TrainConfig.*valid keys: .*precision"):
        from_dict(TrainConfig, {"max_steps": 3, "bf16": True})
    for cls in (BertConfig, ElectraConfig):
        with pytest.raises(ConfigError, match=f"unknown config key 'masked_lm_prob' for {cls.__name__}"):
            from_dict(cls, {"vocab_size": 100, "masked_lm_prob": 0.15})
        with pytest.raises(ConfigError, match="'hiden_size'.*did you mean 'hidden_size'"):
            from_dict(cls, {"hiden_size": 64})
