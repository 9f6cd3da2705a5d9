"""ModelConfig: the settings of the default models, under RLlib's DefaultModelConfig names."""

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt

Activation = Literal["tanh", "relu", "swish", "silu", "elu", "linear"]
PositiveInt = Annotated[StrictInt, Field(gt=0)]
# A kernel or stride: one int for both image dimensions, or (height, width).
Size = PositiveInt | tuple[PositiveInt, PositiveInt]
# [out_channels, kernel, stride] with TensorFlow-style "same" padding, or with the padding given.
ConvFilter = tuple[PositiveInt, Size, Size] | tuple[PositiveInt, Size, Size, Literal["same", "valid"]]


class ModelConfig(BaseModel):
    """What the default actor-critic catalog builds (`models.build_module`).

    Field names, meanings and most defaults are RLlib's `DefaultModelConfig`. Deliberate differences:
    `fcnet_hiddens` is (64, 64), not (256, 256): small nets learn the classic-control tasks as well
    (cleanrl's PPO default) and cost a fraction per forward on a CPU inference server.
    `vf_share_layers` is False (separate value encoder, as in cleanrl's PPO) and `lstm_cell_size` is 128.
    With `use_lstm`, policy and value always share the encoder and its LSTM, so the module has one
    recurrent state {"h", "c"}.

    Frozen and strict (unknown keys and wrong types raise a ValueError); `to_dict()` is JSON-able.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: Sizes of the encoder's hidden layers (1-D observations; also the LSTM's input layers).
    fcnet_hiddens: tuple[PositiveInt, ...] = (64, 64)
    fcnet_activation: Activation = "tanh"
    #: Conv2D stack for image observations; None picks RLlib's default for 96, 84, 64, 42 or 10 px squares and
    #: one chosen for the shape otherwise (`models.catalog.default_conv_filters`).
    conv_filters: Annotated[tuple[ConvFilter, ...], Field(min_length=1)] | None = None
    conv_activation: Activation = "relu"
    #: Hidden layers of the policy and value heads (each head ends in its own linear output layer).
    head_fcnet_hiddens: tuple[PositiveInt, ...] = ()
    head_fcnet_activation: Activation = "relu"
    #: Box actions: log(std) is a learned parameter, not an output of the policy head (SB3's and cleanrl's
    #: state-independent log-std).
    free_log_std: StrictBool = False
    #: The initial log(std) of a free log-std (SB3's log_std_init; e.g. -3.29 for MountainCarContinuous).
    log_std_init: Annotated[float, Field(allow_inf_nan=False)] = 0.0
    #: Box actions: log(std) is clamped to [-log_std_clip_param, log_std_clip_param].
    log_std_clip_param: Annotated[float, Field(gt=0, allow_inf_nan=False)] = 20.0
    #: Whether policy and value share one encoder (stateless models only; LSTM models always share).
    vf_share_layers: StrictBool = False
    #: Orthogonal initialisation of every layer (cleanrl's and SB3's default); False: torch's defaults.
    ortho_init: StrictBool = True
    use_lstm: StrictBool = False
    lstm_cell_size: PositiveInt = 128
    #: Longest sequence the learner cuts episodes into for an LSTM model.
    max_seq_len: PositiveInt = 20

    def __getitem__(self, key: str) -> Any:
        """`config["max_seq_len"]`: connectors read a module's model_config as RLlib's (a dict) is read, so a
        user's module may hold a plain dict instead."""
        if key not in type(self).model_fields:
            raise KeyError(key)
        return getattr(self, key)

    def to_dict(self) -> dict[str, Any]:
        """Return the config as JSON-able builtins (lists, not tuples)."""
        return self.model_dump(mode="json")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ModelConfig":
        """Validate a dict (e.g. parsed JSON) into a ModelConfig; raises ValueError naming bad fields."""
        return cls.model_validate(data)
