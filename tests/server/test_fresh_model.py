"""A server with no learner, checkpoint or --env builds a fresh model for the first hello's spaces: of a
bounded size, and off the event loop, which keeps serving meanwhile."""

from __future__ import annotations

import asyncio

import grpc
import gymnasium as gym
import numpy as np
import pytest
from support import slow_module
from support.servers import BOX4, DISCRETE2, RawStream, hello, until

from rlgate.spec.run import ModelSpec, RunSpec


@pytest.mark.parametrize(
    ("observation_space", "action_space", "what"),
    [
        (gym.spaces.MultiBinary(4_000_000), DISCRETE2, "hello.observation_space: 4000000 values"),  # a tiny hello
        (BOX4, gym.spaces.Discrete(10**12), "hello.action_space: 1000000000000 values"),
        (gym.spaces.Dict({"a": BOX4, "b": gym.spaces.Discrete(200_000)}), DISCRETE2, "200004 values"),
    ],
)
async def test_a_hello_too_large_for_a_fresh_model_is_refused_and_builds_nothing(
    server, observation_space, action_space, what
):
    raw = RawStream(server)
    try:
        await raw.send(hello(observation_space, action_space))
        code, details = await raw.status()
    finally:
        await raw.close()
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert what in details and "at most 131072 (its --max-fresh-space-size)" in details
    assert server.host.core is None
    ok = RawStream(server)  # the next client, within the bound, gets its model
    try:
        await ok.send(hello(gym.spaces.Box(-1, 1, (1000,), np.float32)))
        assert (await ok.recv()).HasField("welcome")
    finally:
        await ok.close()


@pytest.mark.parametrize(
    ("observation_space", "action_space", "what"),
    [
        (BOX4, gym.spaces.MultiBinary(3), "The default model does not support the action space"),
        (gym.spaces.Tuple([]), DISCRETE2, "the observation space Tuple() holds no values (an empty Dict or Tuple)"),
        (gym.spaces.Dict({}), DISCRETE2, "the observation space Dict() holds no values (an empty Dict or Tuple)"),
    ],
)
async def test_a_hello_whose_spaces_no_model_can_serve_is_invalid_argument_and_builds_nothing(
    server, observation_space, action_space, what
):
    raw = RawStream(server)
    try:
        await raw.send(hello(observation_space, action_space))
        code, details = await raw.status()
    finally:
        await raw.close()
    assert code == grpc.StatusCode.INVALID_ARGUMENT  # the client's to fix, not a server error (was INTERNAL)
    assert details.startswith(f"no model for the hello's spaces: {what}")
    assert server.host.core is None
    ok = RawStream(server)
    try:
        await ok.send(hello())
        assert (await ok.recv()).HasField("welcome")
    finally:
        await ok.close()


@pytest.mark.parametrize(
    ("observation_space", "action_space", "what"),
    [
        (BOX4, gym.spaces.Discrete(10**9), "would have 65,000,009,025 parameters, more than the 268,435,456"),
        (gym.spaces.MultiDiscrete([10**9, 10**9]), DISCRETE2, "flattens into 2,000,000,000 values"),
    ],
)
async def test_a_hello_whose_model_would_be_too_large_is_invalid_argument_at_once(
    server_factory, observation_space, action_space, what
):
    """Past --max-fresh-space-size's guard (raised here), the model's own bound refuses it before building."""
    server = await server_factory(max_fresh_space_size=10**12)
    raw = RawStream(server)
    try:
        await raw.send(hello(observation_space, action_space))
        code, details = await asyncio.wait_for(raw.status(), 30)
    finally:
        await raw.close()
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert details.startswith("no model for the hello's spaces: ") and what in details, details
    assert server.host.core is None


async def test_the_server_stays_responsive_while_a_fresh_model_builds(server_factory, http_get):
    slow_module.BUILDING.clear()
    slow_module.GO.clear()
    server = await server_factory(spec=RunSpec(model=ModelSpec(module_class="support.slow_module:BlockingModule")))
    raw = RawStream(server)
    try:
        await raw.send(hello())
        await until(slow_module.BUILDING.is_set, 10)
        assert await asyncio.wait_for(http_get(server.http_port, "/healthz"), 10) == (200, '{"status":"ok"}')
        assert server.host.core is None  # still building
        slow_module.GO.set()
        assert (await raw.recv()).HasField("welcome")
    finally:
        slow_module.GO.set()
        await raw.close()
