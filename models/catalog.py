"""The default catalog: which encoder fits an observation space, which distribution an action space."""

import gymnasium as gym
import numpy as np

from rlgate.core.errors import UserError
from rlgate.core.spaces import flat_size, space_struct
from rlgate.core.tree import flatten
from rlgate.models.config import ConvFilter, ModelConfig
from rlgate.models.distributions import Categorical, DiagGaussian, Distribution, MultiCategorical
from rlgate.models.networks import CNN, MLP, ImageTooSmall

# RLlib's default Conv2D stacks by square image size. The 11x11 layers use "valid" padding (as RLlib's
# old VisionNetwork did), so those stacks end at 1x1x256 features instead of 11x11x256.
DEFAULT_CONV_FILTERS: dict[int, tuple[ConvFilter, ...]] = {
    96: ((16, 8, 4), (32, 4, 2), (256, 11, 2, "valid")),
    84: ((16, 8, 4), (32, 4, 2), (256, 11, 1, "valid")),
    64: ((32, 4, 2), (64, 4, 2), (128, 4, 2), (256, 4, 2)),
    42: ((16, 4, 2), (32, 4, 2), (256, 11, 1, "valid")),
    10: ((16, 5, 2), (32, 5, 2)),
}

# The most parameters a default model may have. 2**28 float32 values are 1 GiB, some 30,000 times CartPole's
# model and more than any policy served here needs: past it, a space is the mistake (Discrete(10**9) actions,
# observations that one-hot into millions of values), and building the model would take minutes and gigabytes.
MAX_PARAMETERS = 2**28

# The leaf spaces FlattenObservations turns into numbers for the default model (inside Dicts and Tuples).
_FLATTENED_LEAVES = (gym.spaces.Box, gym.spaces.Discrete, gym.spaces.MultiDiscrete, gym.spaces.MultiBinary)


class UnsupportedSpace(UserError, ValueError):
    """A space the default model cannot take: the env's, so the person running rlgate can fix it (a
    connector, a ModelConfig field, their own module); a ValueError too, as a server refusing a hello expects."""


def encodes(observation_space: gym.Space) -> bool:
    """Whether the default encoders take this space as it is (else: add FlattenObservations first)."""
    return isinstance(observation_space, gym.spaces.Box) and len(observation_space.shape) in (1, 3)


def check_flattenable(observation_space: gym.Space) -> None:
    """UnsupportedSpace unless FlattenObservations can make these observations a 1-D Box for the default model:
    leaves it flattens (Text, Graph, Sequence are not numbers), and no more values than the model may have
    parameters (its first layer has one per value at least; flattening a sample would allocate them all)."""
    for leaf in flatten(space_struct(observation_space)):
        if not isinstance(leaf, _FLATTENED_LEAVES):
            inside = "" if leaf is observation_space else f" (in {observation_space})"
            raise UnsupportedSpace(
                f"The default model does not support the observation space {leaf}{inside}: it takes Box, Discrete, "
                f"MultiDiscrete and MultiBinary observations, and Dicts and Tuples of them. Turn them into numbers "
                f"with an env wrapper, or name a module of your own (model.module_class)."
            )
    size = flat_size(observation_space)
    if size > MAX_PARAMETERS:
        raise UnsupportedSpace(
            f"The observation space {observation_space} flattens into {size:,} values (Discrete one-hot): the "
            f"default model's first layer would have more than the {MAX_PARAMETERS:,} (2**28) parameters rlgate "
            f"builds. Encode the observations more compactly (e.g. integers as a Box, not one-hot)."
        )


def default_conv_filters(shape: tuple[int, ...]) -> tuple[ConvFilter, ...]:
    """The Conv2D stack for images of `shape` (H, W, C) when conv_filters is unset: RLlib's for its square sizes
    (84x84: its Atari stack), else one chosen for the shape: 4x4 layers of stride 2 ("same" padding), 16
    channels doubling per layer up to 256, until the image is at most 10x10 pixels' worth (H * W <= 100), at
    least one layer. A 64x48 image gets 3 layers (8x6x64 features), 210x160 gets 5 (7x5x256), 40x40 gets 2
    (10x10x32). UnsupportedSpace for an image with no pixels, which no CNN takes."""
    height, width, channels = shape
    if not height or not width or not channels:
        raise UnsupportedSpace(
            f"image observations of shape {shape} have no pixels, which no CNN takes: give the env a Box of shape "
            f"(H, W, C) with each at least 1, or name a module of your own (model.module_class)"
        )
    if height == width and height in DEFAULT_CONV_FILTERS:
        return DEFAULT_CONV_FILTERS[height]
    filters: list[ConvFilter] = []
    while not filters or height * width > 100:
        filters.append((min(16 << len(filters), 256), 4, 2))
        height, width = -(-height // 2), -(-width // 2)
    return tuple(filters)


def build_encoder(observation_space: gym.Space, config: ModelConfig) -> MLP | CNN:
    """An MLP for a 1-D Box, a CNN for an image Box (H, W, C); any other space raises UnsupportedSpace."""
    if isinstance(observation_space, gym.spaces.Box) and len(observation_space.shape) == 1:
        return MLP(observation_space.shape[0], config.fcnet_hiddens, config.fcnet_activation)
    if isinstance(observation_space, gym.spaces.Box) and len(observation_space.shape) == 3:
        shape = observation_space.shape
        filters = config.conv_filters or default_conv_filters(shape)
        try:
            cnn = CNN(shape, filters, config.conv_activation, scale=observation_space.dtype == np.uint8)
        except ImageTooSmall as exc:
            raise UnsupportedSpace(
                f'{exc}: set model.config.conv_filters to layers this image fits, e.g. "same" padding (the default) '
                f"or fewer layers"
            ) from None
        return cnn
    raise UnsupportedSpace(
        f"The default model does not support the observation space {observation_space}: it takes a 1-D "
        f"Box (MLP encoder) or an image Box of shape (H, W, C) (CNN encoder). Add the FlattenObservations "
        f"connector to the env-to-module pipeline, which flattens Dict, Tuple, Discrete, MultiBinary, "
        f"MultiDiscrete and multi-dimensional Box observations into a 1-D Box, and build the module for "
        f"the pipeline's output observation space."
    )


def action_distribution(action_space: gym.Space) -> tuple[type[Distribution], int]:
    """The distribution class for an action space and the number of logits it takes."""
    if isinstance(action_space, gym.spaces.Discrete) and action_space.start == 0:
        return Categorical, int(action_space.n)
    if (
        isinstance(action_space, gym.spaces.MultiDiscrete)
        and action_space.nvec.ndim == 1
        and not action_space.start.any()
    ):
        return MultiCategorical.bind(action_space.nvec.tolist()), int(action_space.nvec.sum())
    if (
        isinstance(action_space, gym.spaces.Box)
        and len(action_space.shape) == 1
        and np.issubdtype(action_space.dtype, np.floating)
    ):
        return DiagGaussian, 2 * action_space.shape[0]
    raise UnsupportedSpace(
        f"The default model does not support the action space {action_space}: it takes Discrete and "
        f"1-D MultiDiscrete (both starting at 0) and 1-D float Box action spaces."
    )
