"""`EnvClient`: runs a gymnasium env or vector env, or PettingZoo envs, against a policy server, one message a step.

A plain env runs as a vector env of one. A PettingZoo ParallelEnv or AECEnv (or a list of them, the sub-envs)
opens a multi-agent session: its hello declares the agents and their spaces, each step carries every
sub-env's acting agents' observations, rewards and done flags (see envs/agent_envs.py). Sub-envs reset
themselves the way gymnasium's vector envs do by default (autoreset mode NEXT_STEP), which is what the
server expects: after a sub-env's episode ends, its next observation is a reset observation. A server that
hands the session over (Actions.reconnect: its max session age, or it is stopping) has seen every recorded
episode end: the client closes the stream and opens a new one through the same target, with fresh episodes,
none cut. A stream that breaks (server restart, network) is re-opened with backoff, and every sub-env starts
a fresh episode; the server ships the old ones as truncated. A server that cannot be reached within
`connect_timeout_s` (when set), or that refuses the stream for a reason a new stream would meet again (spaces
that do not match its model, a wrong token), ends `run()` with a UserError that says so.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Literal

import grpc
import gymnasium as gym
import numpy as np

from rlgate.client.connection import (
    RETRYABLE,
    ClientStats,
    ServerRefused,
    Tally,
    channel_to,
    connected,
    no_model_yet,
)
from rlgate.core import codec
from rlgate.core.agents_step import AgentsStep
from rlgate.core.errors import UserError
from rlgate.envs.agent_envs import AgentEnvs
from rlgate.service.settings import Backend
from rlgate.spec.env import is_multi_agent_env
from rlgate.v1 import policy_pb2 as pb
from rlgate.v1 import policy_pb2_grpc

log = logging.getLogger(__name__)

# How long a failed write waits for the stream's status (it has one by then: the server ended the stream).
STATUS_WAIT_S = 5.0


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
        inference: Literal["server", "local"] = "server",
        allow_import: Iterable[str] = (),
        spool_dir: Path = Path("spool"),
        max_spool_bytes: int = 1 << 30,
        drain_timeout_s: float = 10.0,
        backend: Backend = "torch",
    ) -> None:
        """`env`: a gymnasium env or vector env, or a PettingZoo ParallelEnv / AECEnv (or a list of them: one
        sub-env each). `connect_timeout_s`: how long each connection (the first, and each after a broken
        stream) may take before run() gives up with ServerUnreachable; None: wait for the server forever.

        `inference="local"`: act here with the server's policy instead (client/local.py; single-agent envs): code
        its run spec names is imported only from the modules in `allow_import`; the episodes wait for the
        server's acks in `spool_dir`/<client id> (at most `max_spool_bytes`), and a stopping client gives the
        server `drain_timeout_s` to take them (what is left is sent at the next start with the same client id);
        `backend` runs its forward pass, as a server's --backend does (auto: onnxruntime where it serves; torch by
        default: at one env per client neither is reliably faster, BENCHMARKS.md, B8)."""
        if isinstance(env, list) or is_multi_agent_env(env):
            env = AgentEnvs(env if isinstance(env, list) else [env])
        elif not isinstance(env, gym.vector.VectorEnv):
            single = env  # the one sub-env, bound before `env` becomes the vector env
            env = gym.vector.SyncVectorEnv([lambda: single])
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
        self.metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self._credentials = grpc.ssl_channel_credentials(tls_ca.read_bytes()) if tls_ca else None
        self.max_backoff_s = max_backoff_s
        self._connect_timeout_s = connect_timeout_s
        self._on_step = on_step
        self.inference = inference
        self.allow_import = tuple(allow_import)
        self.spool_dir = spool_dir
        self.max_spool_bytes = max_spool_bytes
        self.drain_timeout_s = drain_timeout_s
        self.backend = backend
        if inference == "local" and isinstance(env, AgentEnvs):
            raise UserError(
                "inference local acts in single-agent runs: a multi-agent env (PettingZoo) needs the server to act "
                "(inference server)"
            )
        self._stopping = False
        self._stopped = asyncio.Event()

    def stop(self) -> None:
        """Finish the current step, send close, and return from run() (or stop waiting for the server)."""
        self._stopping = True
        self._stopped.set()

    async def run(self, max_steps: int = 0) -> ClientStats:
        """Run until max_steps env steps (0: until stop()), reconnecting when the stream breaks. A server that
        refuses stream after stream for one reason (UNAVAILABLE: no model yet, a run spec it may not use) is
        reported once, not every second: the client waits for it quietly. With local inference, the client acts
        itself and only its weights and episodes go through the server (client/local.py)."""
        if self.inference == "local":
            from rlgate.client.local import act_locally  # here: it imports torch, which a client of a server needs not

            await act_locally(self, max_steps)
            return self.stats
        backoff = 0.1
        said: tuple[str, int] | None = None  # the last break warned about, and the env steps then
        while not self.done(max_steps):
            try:
                await self._stream(max_steps)
            except grpc.aio.AioRpcError as exc:
                if exc.code() not in RETRYABLE:
                    raise ServerRefused(self.target, exc.code(), exc.details()) from exc
                self.stats.reconnects += 1
                reason = f"{exc.code().name}: {exc.details()}"
                again = said == (reason, self.stats.env_steps)  # no step since: the server said just that before
                said = (reason, self.stats.env_steps)
                if no_model_yet(exc):  # start-up: said once, at info
                    log.log(logging.DEBUG if again else logging.INFO, "waiting for the server's model (%s)", reason)
                else:
                    log.log(
                        logging.DEBUG if again else logging.WARNING,
                        "stream broke (%s); reconnecting, without saying so again while the server gives this reason",
                        reason,
                    )
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self.max_backoff_s)
            else:
                backoff = 0.1
        return self.stats

    def done(self, max_steps: int) -> bool:
        """Whether to stop: stop() was called, or `max_steps` env steps are taken (0: no limit)."""
        return self._stopping or (max_steps > 0 and self.stats.env_steps >= max_steps)

    def channel(self) -> grpc.aio.Channel:
        """A new channel to the server, this client's own."""
        return channel_to(self.target, self._credentials)

    async def connected(self, channel: grpc.aio.Channel) -> bool:
        """Wait until the channel connects (True) or stop() is called (False); ServerUnreachable on timeout."""
        return await connected(channel, self.target, self._stopped, self._connect_timeout_s)

    async def _stream(self, max_steps: int) -> None:
        """One stream: hello, then step after step with fresh episodes, then close."""
        async with self.channel() as channel:
            if not await self.connected(channel):
                return  # stopped while waiting
            call = policy_pb2_grpc.PolicyServiceStub(channel).Connect(metadata=self.metadata)
            await _write(call, self._hello())
            welcome = await self._read(call)
            self.stats.model_version = welcome.welcome.model_version
            if isinstance(self.env, AgentEnvs):
                await self._agents_loop(call, max_steps)
                return
            n = self.env.num_envs
            obs, _ = self.env.reset(seed=self.seed)
            self.seed = None  # reconnects continue the env's RNG instead of replaying the same episodes
            rewards, terminateds, truncateds = np.zeros(n), np.zeros(n, bool), np.zeros(n, bool)
            tally = Tally(self.stats, n)
            while True:
                await _write(call, step_message(obs, rewards, terminateds, truncateds))
                reply = await self._read(call)
                self.stats.model_version = reply.actions.model_version
                if self._handed_over(reply) or self.done(max_steps):  # the last step's outcome is recorded
                    break
                actions = codec.from_value(reply.actions.actions, "actions")
                obs, rewards, terminateds, truncateds, _ = self.env.step(actions)
                tally.step(rewards, terminateds, truncateds)
                self.stepped()
            await _write(call, pb.ClientMessage(close=pb.Close()))
            await call.done_writing()
            await call.code()

    def stepped(self) -> None:
        """A vector step is counted: tell `on_step`."""
        if self._on_step is not None:
            self._on_step(self.stats)

    def stopping(self) -> asyncio.Event:
        """Set once stop() is called."""
        return self._stopped

    async def _agents_loop(self, call: grpc.aio.StreamStreamCall, max_steps: int) -> None:
        """A multi-agent stream after its welcome: every sub-env's agents' step, then their actions, until done."""
        assert isinstance(self.env, AgentEnvs)  # a multi-agent env's stream
        steps = self.env.reset(seed=self.seed)
        self.seed = None
        returns = [0.0 for _ in steps]  # per sub-env: its episode's return so far, every agent's rewards summed
        while True:
            await _write(call, pb.ClientMessage(step=pb.Step(agents=[_agents_step(s) for s in steps])))
            reply = await self._read(call)
            self.stats.model_version = reply.actions.model_version
            if self._handed_over(reply) or self.done(max_steps):
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
            self.stepped()
        await _write(call, pb.ClientMessage(close=pb.Close()))
        await call.done_writing()
        await call.code()

    def _handed_over(self, reply: pb.ServerMessage) -> bool:
        """The server asks for a new stream (Actions.reconnect): every episode it recorded has ended, so the client
        leaves these actions unused and starts afresh through the same target, which may reach another replica."""
        if not reply.actions.reconnect:
            return False
        self.stats.handovers += 1
        log.info("server handed the session over: reconnecting to %s", self.target)
        return True

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


async def _write(call: grpc.aio.StreamStreamCall, message: pb.ClientMessage) -> None:
    """Write one message. A write to a stream the server has ended (a server stopping as the stream opens) fails with
    gRPC's own INTERNAL 'Internal error from Core', which says nothing of why: the stream's status is raised
    instead (UNAVAILABLE there, after which the client reconnects)."""
    try:
        await call.write(message)
    except (grpc.aio.AioRpcError, asyncio.InvalidStateError) as exc:
        try:
            async with asyncio.timeout(STATUS_WAIT_S):
                code = await call.code()
        except TimeoutError:
            raise exc from None
        if code == grpc.StatusCode.OK:
            raise
        raise grpc.aio.AioRpcError(
            code, await call.initial_metadata(), await call.trailing_metadata(), await call.details()
        ) from exc


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
