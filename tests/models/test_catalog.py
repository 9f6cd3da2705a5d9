"""The default catalog: one actor-critic per observation/action space branch, and what it rejects."""

from collections.abc import Callable

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlgate.core.columns import Columns
from rlgate.models import Categorical, DiagGaussian, ModelConfig, MultiCategorical, build_module, load_weights
from rlgate.models.catalog import UnsupportedSpace, build_encoder
from rlgate.models.weights import weights_to_bytes

FLAT_OBS = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
IMAGE_OBS = gym.spaces.Box(0, 255, (10, 10, 3), np.uint8)
DISCRETE = gym.spaces.Discrete(3)
MULTI_DISCRETE = gym.spaces.MultiDiscrete([3, 2])
BOX = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
ACTION_SPACES = {"discrete": (DISCRETE, 3), "multi_discrete": (MULTI_DISCRETE, 5), "box": (BOX, 4)}


@pytest.mark.parametrize("obs_space", [FLAT_OBS, IMAGE_OBS], ids=["mlp", "cnn"])
@pytest.mark.parametrize("action", ACTION_SPACES)
def test_stateless_shapes(obs_space: gym.Space, action: str, sample_obs: Callable) -> None:
    action_space, num_logits = ACTION_SPACES[action]
    module = build_module(obs_space, action_space)
    assert not module.is_stateful() and module.get_initial_state() == {}
    batch = {Columns.OBS: sample_obs(obs_space, 7)}
    with torch.inference_mode():
        out = module.forward_exploration(batch)
        assert set(out) == {Columns.ACTION_DIST_INPUTS}  # sampling needs no value (RLlib's _forward)
        assert out[Columns.ACTION_DIST_INPUTS].shape == (7, num_logits)
        torch.testing.assert_close(module.forward_inference(batch), out)
    train = module.forward_train(batch)
    assert set(train) == {Columns.ACTION_DIST_INPUTS, Columns.VF_PREDS}
    assert train[Columns.ACTION_DIST_INPUTS].requires_grad
    torch.testing.assert_close(train[Columns.ACTION_DIST_INPUTS].detach(), out[Columns.ACTION_DIST_INPUTS])
    assert train[Columns.VF_PREDS].shape == (7,)
    torch.testing.assert_close(module.compute_values(batch), train[Columns.VF_PREDS].detach())
    actions = module.get_exploration_action_dist_cls().from_logits(train[Columns.ACTION_DIST_INPUTS]).sample()
    assert actions.shape == (7, *action_space.shape)
    if action != "box":
        assert all(action_space.contains(a) for a in actions.numpy().astype(action_space.dtype))


@pytest.mark.parametrize("obs_space", [FLAT_OBS, IMAGE_OBS], ids=["mlp", "cnn"])
@pytest.mark.parametrize("action", ACTION_SPACES)
def test_lstm_shapes(obs_space: gym.Space, action: str, sample_obs: Callable, initial_state: Callable) -> None:
    action_space, num_logits = ACTION_SPACES[action]
    module = build_module(obs_space, action_space, ModelConfig(use_lstm=True, lstm_cell_size=16))
    assert module.is_stateful()
    batch = {Columns.OBS: sample_obs(obs_space, 3, 5), Columns.STATE_IN: initial_state(module, 3)}
    with torch.inference_mode():
        out = module.forward_exploration(batch)
    assert set(out) == {Columns.ACTION_DIST_INPUTS, Columns.STATE_OUT}
    assert out[Columns.ACTION_DIST_INPUTS].shape == (3, 5, num_logits)
    assert {k: v.shape for k, v in out[Columns.STATE_OUT].items()} == {"h": (3, 16), "c": (3, 16)}
    train = module.forward_train(batch)
    assert train[Columns.VF_PREDS].shape == (3, 5)
    torch.testing.assert_close(module.compute_values(batch), train[Columns.VF_PREDS].detach())
    torch.testing.assert_close(train[Columns.ACTION_DIST_INPUTS].detach(), out[Columns.ACTION_DIST_INPUTS])


def test_action_distribution_classes() -> None:
    assert build_module(FLAT_OBS, DISCRETE).get_train_action_dist_cls() is Categorical
    assert build_module(FLAT_OBS, BOX).get_inference_action_dist_cls() is DiagGaussian
    multi = build_module(FLAT_OBS, MULTI_DISCRETE).get_exploration_action_dist_cls()
    assert issubclass(multi, MultiCategorical) and multi.nvec == (3, 2)


def test_initialisation_policy_small_value_not(sample_obs: Callable) -> None:
    module = build_module(FLAT_OBS, DISCRETE)
    with torch.inference_mode():
        out = module.forward_train({Columns.OBS: sample_obs(FLAT_OBS, 256)})
    assert out[Columns.ACTION_DIST_INPUTS].abs().max() < 0.1  # near-uniform first policy
    assert out[Columns.VF_PREDS].std() > 0.05


def test_vf_share_layers_builds_one_encoder() -> None:
    separate = build_module(FLAT_OBS, DISCRETE)
    shared = build_module(FLAT_OBS, DISCRETE, ModelConfig(vf_share_layers=True))
    assert separate.vf_encoder is not None and shared.vf_encoder is None
    n_params = sum(p.numel() for p in shared.parameters())
    assert n_params == sum(p.numel() for p in separate.parameters()) - (4 * 64 + 64 + 64 * 64 + 64)


def test_head_fcnet_hiddens_and_activation(sample_obs: Callable) -> None:
    module = build_module(FLAT_OBS, DISCRETE, ModelConfig(fcnet_hiddens=(8,), head_fcnet_hiddens=(5, 6)))
    assert [layer.out_features for layer in module.pi.hidden] == [5, 6]
    assert module.pi.out.in_features == 6 and module.vf.out.out_features == 1
    with torch.inference_mode():
        out = module.forward_inference({Columns.OBS: sample_obs(FLAT_OBS, 2)})
    assert out[Columns.ACTION_DIST_INPUTS].shape == (2, 3)


@pytest.mark.parametrize("config", [ModelConfig(head_fcnet_hiddens=(5,)), ModelConfig(free_log_std=True)])
def test_the_sampling_forward_follows_loaded_and_replaced_weights(config: ModelConfig, sample_obs: Callable) -> None:
    """The sampling forward runs the encoder's and policy head's layers itself: it must read the weights the
    module holds now, loaded in place (a server's weight swap) or as new parameters (assign=True)."""
    module, other = build_module(FLAT_OBS, BOX, config), build_module(FLAT_OBS, BOX, config)
    with torch.no_grad():
        for parameter in other.parameters():
            parameter.uniform_(-1.0, 1.0)
    batch = {Columns.OBS: sample_obs(FLAT_OBS, 4)}
    with torch.inference_mode():
        expected = other.forward_train(batch)[Columns.ACTION_DIST_INPUTS]
        torch.testing.assert_close(other.forward_exploration(batch)[Columns.ACTION_DIST_INPUTS], expected)
        assert not torch.allclose(module.forward_exploration(batch)[Columns.ACTION_DIST_INPUTS], expected)
    load_weights(module, weights_to_bytes(other))
    with torch.inference_mode():
        torch.testing.assert_close(module.forward_exploration(batch)[Columns.ACTION_DIST_INPUTS], expected)
    replaced = build_module(FLAT_OBS, BOX, config)
    replaced.load_state_dict({k: v.clone() for k, v in other.state_dict().items()}, assign=True)
    with torch.inference_mode():
        torch.testing.assert_close(replaced.forward_inference(batch)[Columns.ACTION_DIST_INPUTS], expected)


def test_free_log_std_is_a_parameter(sample_obs: Callable) -> None:
    module = build_module(FLAT_OBS, BOX, ModelConfig(free_log_std=True))
    assert module.pi.out.out_features == 2 and module.log_std.shape == (2,)
    with torch.no_grad():
        module.log_std.copy_(torch.tensor([-1.0, 0.5]))
        out = module.forward_inference({Columns.OBS: sample_obs(FLAT_OBS, 3)})
    assert out[Columns.ACTION_DIST_INPUTS][:, 2:].tolist() == [[-1.0, 0.5]] * 3


def test_log_std_is_clipped(sample_obs: Callable) -> None:
    module = build_module(FLAT_OBS, BOX, ModelConfig(log_std_clip_param=2.0))
    with torch.no_grad():
        module.pi.out.bias.copy_(torch.tensor([0.0, 0.0, 50.0, -50.0]))
        out = module.forward_inference({Columns.OBS: sample_obs(FLAT_OBS, 3)})
    log_std = out[Columns.ACTION_DIST_INPUTS][:, 2:]
    assert log_std.tolist() == [[2.0, -2.0]] * 3


def test_uint8_images_are_scaled(sample_obs: Callable) -> None:
    float_space = gym.spaces.Box(0.0, 1.0, (10, 10, 3), np.float32)
    as_uint8, as_float = build_module(IMAGE_OBS, DISCRETE), build_module(float_space, DISCRETE)
    load_weights(as_float, weights_to_bytes(as_uint8))
    images = sample_obs(IMAGE_OBS, 4)
    with torch.inference_mode():
        out_uint8 = as_uint8.forward_inference({Columns.OBS: images})
        out_float = as_float.forward_inference({Columns.OBS: images.float() / 255.0})
    torch.testing.assert_close(out_uint8, out_float)


def test_default_and_custom_conv_filters(sample_obs: Callable) -> None:
    atari = gym.spaces.Box(0, 255, (84, 84, 4), np.uint8)
    assert build_encoder(atari, ModelConfig()).out_dim == 256  # RLlib's 84x84 stack, its 11x11 layer "valid"
    odd = gym.spaces.Box(0.0, 1.0, (20, 24, 1), np.float32)
    config = ModelConfig(conv_filters=((4, (3, 5), 2), (8, 3, (1, 2), "valid")))
    # same: 20x24 -> 10x12; valid 3x3 with stride (1, 2): 8x5.
    assert build_encoder(odd, config).out_dim == 8 * 5 * 8
    module = build_module(odd, DISCRETE, config)
    with torch.inference_mode():
        assert module.forward_train({Columns.OBS: sample_obs(odd, 2)})[Columns.VF_PREDS].shape == (2,)
    with pytest.raises(UnsupportedSpace, match=r"to nothing: set model.config.conv_filters"):
        build_module(odd, DISCRETE, ModelConfig(conv_filters=((4, 30, 1, "valid"),)))


@pytest.mark.parametrize(
    ("shape", "features"),
    [
        ((64, 48, 3), 8 * 6 * 64),  # 3 layers of stride 2
        ((210, 160, 3), 7 * 5 * 256),  # an Atari frame as the env makes it: 5 layers
        ((40, 40, 3), 10 * 10 * 32),  # MiniGrid-Empty-5x5 in RGB (8 px tiles)
        ((20, 24, 1), 5 * 6 * 32),  # 10x12 after one layer is still more than 10x10 pixels
        ((7, 7, 3), 4 * 4 * 16),  # smaller than that already: still one layer
        ((1, 300, 2), 1 * 75 * 32),  # a strip
    ],
)
def test_a_cnn_for_any_image_size_without_conv_filters(shape, features, sample_obs: Callable) -> None:
    """Images of sizes RLlib has no stack for train with filters chosen for their shape (was: "No default
    conv_filters" for anything but 96, 84, 64, 42 and 10 pixel squares)."""
    space = gym.spaces.Box(0, 255, shape, np.uint8)
    assert build_encoder(space, ModelConfig()).out_dim == features
    module = build_module(space, DISCRETE)
    batch = {Columns.OBS: sample_obs(space, 3)}
    train = module.forward_train(batch)
    assert train[Columns.ACTION_DIST_INPUTS].shape == (3, 3) and train[Columns.VF_PREDS].shape == (3,)
    train[Columns.VF_PREDS].sum().backward()  # it trains: gradients reach the first conv layer
    assert module.vf_encoder.convs[0].weight.grad.abs().sum() > 0


def test_an_image_with_no_pixels_is_refused_saying_what_to_set() -> None:
    with pytest.raises(UnsupportedSpace, match=r"\(0, 8, 3\) have no pixels, which no CNN takes: give the env a Box"):
        build_module(gym.spaces.Box(0, 255, (0, 8, 3), np.uint8), DISCRETE)


@pytest.mark.parametrize(
    "space",
    [
        gym.spaces.Dict({"a": FLAT_OBS}),
        gym.spaces.Tuple((FLAT_OBS, DISCRETE)),
        gym.spaces.Discrete(5),
        gym.spaces.MultiBinary(4),
        gym.spaces.MultiDiscrete([2, 3]),
        gym.spaces.Box(-1.0, 1.0, (2, 3), np.float32),
    ],
    ids=["dict", "tuple", "discrete", "multi_binary", "multi_discrete", "box_2d"],
)
def test_unsupported_observation_spaces_point_to_flatten(space: gym.Space) -> None:
    with pytest.raises(ValueError, match="FlattenObservations"):
        build_module(space, DISCRETE)


@pytest.mark.parametrize(
    "space",
    [
        gym.spaces.Box(-1.0, 1.0, (2, 2), np.float32),
        gym.spaces.Box(0, 5, (2,), np.int64),
        gym.spaces.Discrete(3, start=1),
        gym.spaces.MultiDiscrete([[2, 3], [2, 2]]),
        gym.spaces.MultiBinary(3),
        gym.spaces.Dict({"a": DISCRETE}),
    ],
    ids=["box_2d", "box_int", "discrete_start", "multi_discrete_2d", "multi_binary", "dict"],
)
def test_unsupported_action_spaces(space: gym.Space) -> None:
    with pytest.raises(ValueError, match="action space"):
        build_module(FLAT_OBS, space)


def test_a_free_log_std_starts_at_log_std_init_and_init_can_be_torchs_own():
    module = build_module(FLAT_OBS, BOX, ModelConfig(free_log_std=True, log_std_init=-1.5))
    assert torch.equal(module.log_std.data, torch.full_like(module.log_std, -1.5))
    torch.manual_seed(0)
    ortho = build_module(FLAT_OBS, BOX, ModelConfig(ortho_init=True)).pi.out.bias
    torch.manual_seed(0)
    default = build_module(FLAT_OBS, BOX, ModelConfig(ortho_init=False)).pi.out.bias
    assert not ortho.any() and default.any()  # orthogonal init zeroes biases; torch's draws them
