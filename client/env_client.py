"""`EnvClient`: runs a gymnasium env or vector env, or PettingZoo envs, against a policy server, one message a step.

A plain env runs as a vector env of one. A PettingZoo ParallelEnv or AECEnv (or a list of them, the sub-envs)
opens a multi-agent session: its hello declares the agents and their spaces, each step carries every
sub-env's acting agents' observations, rewards and done flags (see spec/agent_envs.py). Sub-envs reset
themselves the way gymnasium's vector envs do by default (autoreset mode NEXT_STEP), which is what the
server expects: after a sub-env's episode ends, its next observation is a reset observation. A stream that
breaks (server restart, network) is re-opened with backoff, and every sub-env starts a fresh episode; the
server ships the old ones as truncated. A server that cannot be reached within `connect_timeout_s` (when
set), or that refuses the stream for a reason a new stream would meet again (spaces that do not match its
model, a wrong token), ends `run()` with a UserError that says so.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import gymnasium as gym
import numpy as np

from rlgate.core import codec
from rlgate.core.agents_step import AgentsStep
from rlgate.core.errors import UserError
from rlgate.service.channel import CHANNEL_OPTIONS as RECONNECT_AND_KEEPALIVE
from rlgate.spec.agent_envs import AgentEnvs
from rlgate.spec.env import is_multi_agent_env
from rlgate.v1 import policy_pb2 as pb
from rlgate.v1 import policy_pb2_grpc

log = logging.getLogger(__name__)

# Codes after which a fresh stream may well succeed; any other error is the client's to fix.
RETRYABLE = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.ABORTED,
    }
)

# A target like dns:///inference:50051 resolves to every replica; round_robin spreads streams over them
# (each stream, once open, stays on its replica, so its episodes never move). Each client has a connection
# of its own (gRPC would share one between a process's channels to one target): a server's workers, which
# share its port, get connections spread over them by the kernel, not streams.
CHANNEL_OPTIONS = (
    ("grpc.service_config", json.dumps({"loadBalancingConfig": [{"round_robin": {}}]})),
    ("grpc.use_local_subchannel_pool", 1),
    *RECONNECT_AND_KEEPALIVE,
)
# While the server is unreachable, one warning after this long, not one per attempt.
WARN_AFTER_S = 1.0


class ServerRefused(UserError):
    """The server ended the stream with a status that a new stream would get too: the client's to fix."""

    def __init__(self, target: str, code: grpc.StatusCode, details: str | None) -> None:
        super().__init__(f"the server at {target} refused the stream: {code.name}: {details}")
        self.code = code
        self.details = details


class ServerUnreachable(UserError):
    """No connection to the server within the client's connect timeout."""


@dataclass
class ClientStats:
    """What a client did so far."""

    env_steps: int = 0
    episodes: int = 0
    reconnects: int = 0
    model_version: int = -1
    returns: deque[float] = field(default_factory=lambda: deque(maxlen=100))

    def mean_return(self) -> float | None:
        return float(np.mean(self.returns)) if self.returns else None


class EnvClient:
    """Steps `env` with actions from the server at `target` until `max_steps` env steps or `stop()`."""

    def __init__(
        self,
        env: gym.Env | gym.vector.VectorEnv | Any,
        target: str,
        *,
        client_id: str | None = None,
        explore: bool = True,
        seed: int | None = None,
        token: str | None = None,
        tls_ca: Path | None = None,
        max_backoff_s: float = 1.0,
        connect_timeout_s: float | None = None,
        on_step: Callable[[ClientStats], None] | None = None,
    ) -> None:
        """`env`: a gymnasium env or vector env, or a PettingZoo ParallelEnv / AECEnv (or a list of them: one
        sub-env each). `connect_timeout_s`: how long each connection (the first, and each after a broken
        stream) may take before run() gives up with ServerUnreachable; None: wait for the server forever."""
        if isinstance(env, list) or is_multi_agent_env(env):
            env = AgentEnvs(env if isinstance(env, list) else [env])
        elif not isinstance(env, gym.vector.VectorEnv):
            env = gym.vector.SyncVectorEnv([lambda: env])
        if isinstance(env, gym.vector.VectorEnv):
            mode = env.metadata.get("autoreset_mode", gym.vector.AutoresetMode.NEXT_STEP)
            if mode != gym.vector.AutoresetMode.NEXT_STEP:
                raise ValueError(f"vector env autoreset mode is {mode}; rlgate needs AutoresetMode.NEXT_STEP")
        self.env = env
        self.target = target
        self.client_id = client_id or f"client-{uuid.uuid4().hex[:8]}"
        self.explore = explore
        self.seed = seed
        self.stats = ClientStats()
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self._credentials = grpc.ssl_channel_credentials(tls_ca.read_bytes()) if tls_ca else None
        self._max_backoff_s = max_backoff_s
        self._connect_timeout_s = connect_timeout_s
        self._on_step = on_step
        self._stopping = False
        self._stopped = asyncio.Event()

    def stop(self) -> None:
        """Finish the current step, send close, and return from run() (or stop waiting for the server)."""
        self._stopping = True
        self._stopped.set()

    async def run(self, max_steps: int = 0) -> ClientStats:
        """Run until max_steps env steps (0: until stop()), reconnecting when the stream breaks. A server that
        refuses stream after stream for one reason (UNAVAILABLE: no model yet, a run spec it may not use) is
        reported once, not every second: the client waits for it quietly."""
        backoff = 0.1
        said: tuple[str, int] | None = None  # the last break warned about, and the env steps then
        while not self._done(max_steps):
            try:
                await self._stream(max_steps)
            except grpc.aio.AioRpcError as exc:
                if exc.code() not in RETRYABLE:
                    raise ServerRefused(self.target, exc.code(), exc.details()) from exc
                self.stats.reconnects += 1
                reason = f"{exc.code().name}: {exc.details()}"
                again = said == (reason, self.stats.env_steps)  # no step since: the server said just that before
                said = (reason, self.stats.env_steps)
                log.log(
                    logging.DEBUG if again else logging.WARNING,
                    "stream broke (%s); reconnecting, without saying so again while the server gives this reason",
                    reason,
                )
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self._max_backoff_s)
            else:
                backoff = 0.1
        return self.stats

    def _done(self, max_steps: int) -> bool:
        return self._stopping or (max_steps > 0 and self.stats.env_steps >= max_steps)

    async def _stream(self, max_steps: int) -> None:
        """One stream: hello, then step after step with fresh episodes, then close."""
        if self._credentials is not None:
            channel = grpc.aio.secure_channel(self.target, self._credentials, options=CHANNEL_OPTIONS)
        else:
            channel = grpc.aio.insecure_channel(self.target, options=CHANNEL_OPTIONS)
        async with channel:
            if not await self._connected(channel):
                return  # stopped while waiting
            call = policy_pb2_grpc.PolicyServiceStub(channel).Connect(metadata=self._metadata)
            await call.write(self._hello())
            welcome = await self._read(call)
            self.stats.model_version = welcome.welcome.model_version
            if isinstance(self.env, AgentEnvs):
                await self._agents_loop(call, max_steps)
                return
            n = self.env.num_envs
            obs, _ = self.env.reset(seed=self.seed)
            self.seed = None  # reconnects continue the env's RNG instead of replaying the same episodes
            rewards, terminateds, truncateds = np.zeros(n), np.zeros(n, bool), np.zeros(n, bool)
            returns = np.zeros(n)
            resetting = np.zeros(n, bool)  # sub-envs whose next env.step() only resets them
            while True:
                await call.write(step_message(obs, rewards, terminateds, truncateds))
                reply = await self._read(call)
                self.stats.model_version = reply.actions.model_version
                if self._done(max_steps):  # the last step's outcome is sent: the server records it
                    break
                actions = codec.from_value(reply.actions.actions, "actions")
                obs, rewards, terminateds, truncateds, _ = self.env.step(actions)
                returns += rewards
                self.stats.env_steps += int(n - resetting.sum())  # transitions; a reset is not an env step
                resetting = terminateds | truncateds
                self.stats.returns.extend(returns[resetting].tolist())
                returns[resetting] = 0.0
                self.stats.episodes += int(resetting.sum())
                if self._on_step is not None:
                    self._on_step(self.stats)
            await call.write(pb.ClientMessage(close=pb.Close()))
            await call.done_writing()
            await call.code()

    async def _connected(self, channel: grpc.aio.Channel) -> bool:
        """Wait until the channel connects (True) or stop() is called (False); ServerUnreachable on timeout."""
        ready = asyncio.ensure_future(channel.channel_ready())
        stopped = asyncio.ensure_future(self._stopped.wait())
        waiting = {ready, stopped}
        try:
            async with asyncio.timeout(self._connect_timeout_s):
                done, _ = await asyncio.wait(waiting, timeout=WARN_AFTER_S, return_when=asyncio.FIRST_COMPLETED)
                if not done:
                    limit = "" if self._connect_timeout_s is None else f" for up to {self._connect_timeout_s:g} s"
                    log.warning("server at %s not reachable yet; trying%s", self.target, limit)
                    done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
        except TimeoutError:
            raise ServerUnreachable(
                f"cannot reach the server at {self.target} within {self._connect_timeout_s:g} s"
            ) from None
        finally:
            for future in waiting:
                future.cancel()
        return ready in done

    async def _agents_loop(self, call: grpc.aio.StreamStreamCall, max_steps: int) -> None:
        """A multi-agent stream after its welcome: every sub-env's agents' step, then their actions, until done."""
        steps = self.env.reset(seed=self.seed)
        self.seed = None
        returns = [0.0 for _ in steps]  # per sub-env: its episode's return so far, every agent's rewards summed
        while True:
            await call.write(pb.ClientMessage(step=pb.Step(agents=[_agents_step(s) for s in steps])))
            reply = await self._read(call)
            self.stats.model_version = reply.actions.model_version
            if self._done(max_steps):
                break
            actions = [
                {agent: codec.from_value(value, f"actions[{agent!r}]") for agent, value in per_env.actions.items()}
                for per_env in reply.actions.agents
            ]
            was_done = list(self.env.done)
            steps = self.env.step(actions)
            for i, step in enumerate(steps):
                if was_done[i]:  # a reset, not an env step
                    returns[i] = 0.0
                    continue
                self.stats.env_steps += 1
                returns[i] += sum(step.rewards.values())
                if self.env.done[i]:  # its agents left (with "__all__" or each with its own flag)
                    self.stats.episodes += 1
                    self.stats.returns.append(returns[i])  # as RLlib's episode return: all agents' rewards
            if self._on_step is not None:
                self._on_step(self.stats)
        await call.write(pb.ClientMessage(close=pb.Close()))
        await call.done_writing()
        await call.code()

    @staticmethod
    async def _read(call: grpc.aio.StreamStreamCall) -> pb.ServerMessage:
        reply = await call.read()
        if reply is grpc.aio.EOF:
            empty = grpc.aio.Metadata()
            raise grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, empty, empty, "server ended the stream")
        return reply

    def _hello(self) -> pb.ClientMessage:
        env = self.env
        if isinstance(env, AgentEnvs):
            agents = [
                pb.AgentSpaces(
                    agent_id=agent,
                    observation_space=codec.space_to_proto(spaces[0]),
                    action_space=codec.space_to_proto(spaces[1]),
                )
                for agent, spaces in env.agent_spaces.items()
            ]
            return pb.ClientMessage(
                hello=pb.Hello(client_id=self.client_id, num_envs=env.num_envs, explore=self.explore, agents=agents)
            )
        return hello_message(
            env.single_observation_space, env.single_action_space, env.num_envs, self.explore, self.client_id
        )


def step_message(obs: Any, rewards: np.ndarray, terminateds: np.ndarray, truncateds: np.ndarray) -> pb.ClientMessage:
    """One step of every sub-env: observations, and the rewards and done flags of the step that led to them."""
    message = pb.ClientMessage()
    step = message.step  # filled in place: building each field's message and copying it in costs twice as much
    codec.fill_value(step.obs, obs)
    codec.fill_tensor(step.reward, rewards)
    codec.fill_tensor(step.terminated, terminateds)
    codec.fill_tensor(step.truncated, truncateds)
    return message


def hello_message(
    observation_space: gym.Space, action_space: gym.Space, num_envs: int, explore: bool, client_id: str
) -> pb.ClientMessage:
    """The message that opens a session: the env's spaces, how many sub-envs each step carries, explore."""
    return pb.ClientMessage(
        hello=pb.Hello(
            client_id=client_id,
            observation_space=codec.space_to_proto(observation_space),
            action_space=codec.space_to_proto(action_space),
            num_envs=num_envs,
            explore=explore,
        )
    )


def _agents_step(step: AgentsStep) -> pb.AgentsStep:
    return pb.AgentsStep(
        obs={agent: codec.to_value(observation) for agent, observation in step.observations.items()},
        rewards=step.rewards,
        terminateds=step.terminateds,
        truncateds=step.truncateds,
    )
