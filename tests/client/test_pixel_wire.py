"""What an Atari env client sends: one 84x84 uint8 frame per env step, within 7.5 KB per env step."""

from __future__ import annotations

import numpy as np
import pytest

from rlgate.bench.envs import preset_spec
from rlgate.client.env_client import step_message
from rlgate.core import codec
from rlgate.spec.env import make_env
from rlgate.spec.imports import ImportPolicy


def test_a_pong_step_message_carries_one_uint8_frame_per_env_step() -> None:
    pytest.importorskip("ale_py", reason="ALE needs ale-py (pip install 'rlgate[atari]')")
    spec = preset_spec("ALE/Pong-v5")
    envs = make_env(spec.env, ImportPolicy(spec.modules()))  # the preset's 8 envs, wrapped as a client makes them
    try:
        envs.reset(seed=0)
        obs, rewards, terminateds, truncateds, _ = envs.step(envs.action_space.sample())
    finally:
        envs.close()
    message = step_message(obs, rewards, terminateds, truncateds)
    sent = codec.from_value(message.step.obs)
    assert sent.dtype == np.uint8 and sent.shape == (8, 84, 84, 1)  # single frames: the server stacks them
    per_step = message.ByteSize() / 8
    assert 84 * 84 < per_step <= 7_500, per_step
