"""ModelConfig: defaults, JSON round trip, and validation errors."""

import json
import math

import pydantic
import pytest

from rlgate.models import ModelConfig


def test_defaults() -> None:
    config = ModelConfig()
    assert config.fcnet_hiddens == (64, 64) and config.fcnet_activation == "tanh"
    assert config.conv_filters is None and config.conv_activation == "relu"
    assert config.head_fcnet_hiddens == () and not config.vf_share_layers and not config.free_log_std
    assert (config.use_lstm, config.lstm_cell_size, config.max_seq_len) == (False, 128, 20)


def test_json_round_trip() -> None:
    config = ModelConfig(
        fcnet_hiddens=(32,),
        conv_filters=((16, 4, 2), (32, (3, 5), (1, 2), "valid")),
        head_fcnet_hiddens=(8, 8),
        use_lstm=True,
        free_log_std=True,
        log_std_clip_param=5.0,
    )
    data = json.loads(json.dumps(config.to_dict()))
    assert data["conv_filters"] == [[16, 4, 2], [32, [3, 5], [1, 2], "valid"]]
    assert ModelConfig.from_dict(data) == config
    assert ModelConfig.from_dict({}) == ModelConfig()


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"fcnet_hidden": [64]}, "fcnet_hidden"),
        ({"fcnet_hiddens": [64, 0]}, "fcnet_hiddens"),
        ({"fcnet_hiddens": [64.0]}, "fcnet_hiddens"),
        ({"fcnet_hiddens": ["64"]}, "fcnet_hiddens"),
        ({"fcnet_activation": "sigmoid"}, "fcnet_activation"),
        ({"conv_filters": []}, "conv_filters"),
        ({"conv_filters": [[16, 4]]}, "conv_filters"),
        ({"conv_filters": [[16, 4, 2, "full"]]}, "conv_filters"),
        ({"use_lstm": 1}, "use_lstm"),
        ({"lstm_cell_size": True}, "lstm_cell_size"),
        ({"max_seq_len": -1}, "max_seq_len"),
        ({"log_std_clip_param": math.inf}, "log_std_clip_param"),
        ({"log_std_clip_param": 0.0}, "log_std_clip_param"),
    ],
)
def test_validation_errors_name_the_field(data: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        ModelConfig.from_dict(data)


def test_frozen() -> None:
    config = ModelConfig()
    with pytest.raises(pydantic.ValidationError, match="frozen"):
        config.use_lstm = True
