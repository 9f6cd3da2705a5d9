"""Data-parallel learners: N processes in one torch.distributed group train one model (RLlib's `num_learners`).

Rank 0 is the learner service (intake, acks, checkpoints, weight publishing) and runs the learner pipeline; each
update it scatters the train batch's rows into one shard per rank (one packed tensor per rank, no pickle), and
after each backward pass the gradients are all-reduced, each rank's weighted by its rows: the step every rank
takes is the one a single learner takes on the whole batch, so the ranks' weights stay identical (compared by
digest after every update). PPO: every rank runs the epochs on its shard, cut into as many minibatches as one
learner would cut the whole batch into. DQN and SAC: rank 0 holds the replay buffer and samples each update's
train batch, which it scatters; each optimizer step's gradients are all-reduced, and rank 0 gathers the TD errors
back for a prioritized buffer's priorities. Multi-agent runs share out each trained module's batch in turn, its
gradients all-reduced within its parameters. The other ranks get the run spec, the spaces, the weights and the
optimizer state from rank 0 when the group forms, so they need no spec, checkpoint or env of their own.

The rendezvous is torchrun's: RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT (`rlgate learn --num-learners N`
starts ranks 1..N-1 itself with these set, on 127.0.0.1). The backend follows the learner's device: NCCL where
the ranks train on CUDA (each on cuda:LOCAL_RANK), gloo on the CPU; what the ranks send each other (headers,
shards, gradients, digests, optimizer state) is on that device.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import sys
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import gymnasium as gym
import torch
import torch.distributed as dist

from rlgate.core import codec
from rlgate.core.errors import UserError
from rlgate.core.tree import flatten, map_structure
from rlgate.learner.adam import Adam, fresh_state
from rlgate.learner.settings import COLLECTIVE_TIMEOUT_S
from rlgate.spec.run import RunSpec

log = logging.getLogger(__name__)

# Under gloo a rank that dies closes its connections and fails the others' collectives at once; one that hangs, or
# dies unseen (NCCL has no such signal), fails them when a collective has waited this long (LearnerSettings'
# collective_timeout_s, COLLECTIVE_TIMEOUT_S by default). Rank 0 idle (its servers away) sends a heartbeat every
# HEARTBEATS-th of it (`keep_alive`), so the other ranks' wait for its next update never reaches it.
HEARTBEATS = 4
FAILED = 1  # exit status of a rank whose group broke


def backend_for(device: torch.device) -> str:
    """The torch.distributed backend for ranks that train on `device`: NCCL for CUDA, gloo for the CPU."""
    return "nccl" if device.type == "cuda" else "gloo"


class GroupFailed(RuntimeError):
    """A rank of the group died, hung or diverged: the group cannot go on (its learner restarts from a checkpoint)."""


@dataclass(frozen=True)
class Rendezvous:
    """Where the ranks meet (torchrun's variables) and which one this process is."""

    rank: int
    size: int
    address: str
    port: int

    @classmethod
    def from_env(cls) -> Rendezvous | None:
        """torchrun's RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT; None where WORLD_SIZE is unset. UserError if bad."""
        if "WORLD_SIZE" not in os.environ:
            return None
        try:
            rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
            found = cls(rank, size, os.environ.get("MASTER_ADDR", "127.0.0.1"), int(os.environ["MASTER_PORT"]))
        except (KeyError, ValueError) as exc:
            raise UserError(f"WORLD_SIZE is set, but RANK and MASTER_PORT must be numbers too: {exc}") from None
        if not 0 <= rank < size:
            raise UserError(f"RANK={rank} is not a rank of WORLD_SIZE={size}")
        return found

    def env(self, rank: int) -> dict[str, str]:
        """The variables that make a process rank `rank` of this group."""
        return {
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(self.size),
            "MASTER_ADDR": self.address,
            "MASTER_PORT": str(self.port),
        }


@dataclass
class Start:
    """What rank 0 tells the others when the group forms: the run and the spaces its module is built for."""

    spec: RunSpec
    observation_space: gym.Space
    action_space: gym.Space


class Group:
    """This process's place in the learners' process group, and the collectives the learners use."""

    def __init__(
        self,
        rendezvous: Rendezvous,
        timeout_s: float,
        device: torch.device | None = None,
        collective_timeout_s: float = COLLECTIVE_TIMEOUT_S,
    ) -> None:
        """Join the group (blocks until every rank has); UserError naming the address if that takes over
        `timeout_s` (a rank that cannot reach rank 0, or one that never comes). `device`: where this rank trains
        (default the CPU), which sets the backend (`backend_for`) and where the tensors it sends live. A collective
        that waits `collective_timeout_s` breaks the group (GroupFailed)."""
        self.rank, self.size = rendezvous.rank, rendezvous.size
        self.heartbeat_s = collective_timeout_s / HEARTBEATS
        self._last_collective = time.monotonic()
        self.device = device if device is not None else torch.device("cpu")
        backend = backend_for(self.device)
        self.rows = 0  # the current update's rows, all ranks' together
        self.seconds: dict[str, float] = {}  # the current update's seconds in collectives, by kind (its stats)
        where = f"{rendezvous.address}:{rendezvous.port}"
        # Under torchrun's agent the store is the agent's; else rank 0 holds it.
        agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
        try:
            store = dist.TCPStore(
                rendezvous.address,
                rendezvous.port,
                self.size,
                is_master=self.rank == 0 and not agent_store,
                timeout=timedelta(seconds=timeout_s),
            )
            if backend == "nccl":
                torch.cuda.set_device(self.device)  # NCCL's communicator binds to the current device
            dist.init_process_group(
                backend,
                store=store,
                rank=self.rank,
                world_size=self.size,
                timeout=timedelta(seconds=collective_timeout_s),
            )
        except dist.DistError as exc:
            reason = " ".join(str(exc).split())[:200]
            raise UserError(
                f"learner rank {self.rank} of {self.size}: the group did not form at {where} within {timeout_s:g} s "
                f"(--rendezvous-timeout-s): {reason}"
            ) from None
        log.info("learner rank %d of %d joined at %s (%s, %s)", self.rank, self.size, where, backend, self.device)

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()

    # --- rank 0 tells, the others follow ---------------------------------------------------------------

    def send_start(self, spec: RunSpec, observation_space: gym.Space, action_space: gym.Space) -> None:
        self._send_header(
            {
                "spec": spec.to_json(),
                "observation_space": codec.space_to_json(observation_space),
                "action_space": codec.space_to_json(action_space),
            }
        )

    def receive_start(self) -> Start:
        header = self._receive_header()
        return Start(
            RunSpec.from_json(header["spec"], "rank 0's run spec"),
            codec.space_from_json(header["observation_space"]),
            codec.space_from_json(header["action_space"]),
        )

    def share_state(self, module: torch.nn.Module, *optimizers: Adam) -> None:
        """Give every rank rank 0's weights and optimizers' states (the other ranks' are overwritten)."""
        params = [optimizer.param_groups[0]["params"] for optimizer in optimizers]
        if self.rank == 0:
            held = [[i for i, p in enumerate(ps) if p in o.state] for ps, o in zip(params, optimizers, strict=True)]
            self._send_header({"optimizer_state": held})
        else:
            held = self._receive_header()["optimizer_state"]
            for ps, optimizer, indices in zip(params, optimizers, held, strict=True):
                for i in indices:
                    optimizer.state[ps[i]] = fresh_state(ps[i])
        tensors = list(module.state_dict().values())  # the live tensors: broadcast fills them in place
        for ps, optimizer in zip(params, optimizers, strict=True):
            for parameter in ps:
                tensors += optimizer.state[parameter].values() if parameter in optimizer.state else ()
        self._collective(lambda: [dist.broadcast(tensor, src=0) for tensor in tensors])

    def send_batch(self, batch: dict[str, Any], env_steps: int, **fields: Any) -> dict[str, Any]:
        """Rank 0: scatter the train batch's rows (every column cut along its first dimension) into one shard
        per rank (their sizes differ by one at most); returns rank 0's. `env_steps` (the trainer's, before this
        update) sets the ranks' schedules; `fields` (JSON) go with it to the other ranks (receive_batch)."""
        leaves = flatten(batch)
        rows = len(leaves[0])
        columns = [leaf.reshape(rows, -1).contiguous().view(torch.uint8) for leaf in leaves]
        described = iter([[str(leaf.dtype).removeprefix("torch."), list(leaf.shape[1:])] for leaf in leaves])
        skeleton = map_structure(lambda _: next(described), batch)
        self.rows, self.seconds = rows, {}
        header = {**fields, "op": "update", "env_steps": env_steps, "rows": rows, "columns": skeleton}
        self._send_header(header, "scatter_s")
        packed = torch.cat(columns, dim=1)
        shards = [self._padded(shard) for shard in packed.tensor_split(self.size)]
        shard = torch.empty_like(shards[0])
        self._collective(lambda: dist.scatter(shard, shards, src=0), "scatter_s")
        return _unpack(shard[: self._shard_rows(rows, self.rank)], skeleton)

    def keep_alive(self) -> None:
        """Rank 0: a heartbeat, unless a collective ran within `heartbeat_s` (an update, the last heartbeat)."""
        if time.monotonic() - self._last_collective >= self.heartbeat_s:
            self._send_header({"op": "idle"})

    def receive_batch(self) -> tuple[dict[str, Any], dict[str, Any]] | None:
        """The other ranks: the next update's header (its `env_steps`, the fields rank 0 sent) and this rank's
        shard, or None when rank 0 stops the group. Rank 0's heartbeats are waited through."""
        while (header := self._receive_header())["op"] == "idle":
            pass
        if header["op"] == "stop":
            return None
        rows, skeleton = header["rows"], header["columns"]
        width = sum(_dtype(dtype).itemsize * math.prod(shape) for dtype, shape in flatten(skeleton))
        shard = torch.empty(math.ceil(rows / self.size), width, dtype=torch.uint8, device=self.device)
        self.rows, self.seconds = rows, {}
        self._collective(lambda: dist.scatter(shard, src=0), "scatter_s")
        return header, _unpack(shard[: self._shard_rows(rows, self.rank)], skeleton)

    def gather(self, shard: torch.Tensor) -> torch.Tensor | None:
        """Every rank's rows of a per-row tensor of the current update (its shard's TD errors), put back in the
        train batch's order: rank 0 gets them, the others None."""
        padded = self._padded(shard.detach().contiguous())
        every = [torch.empty_like(padded) for _ in range(self.size)] if self.rank == 0 else None
        self._collective(lambda: dist.gather(padded, every, dst=0), "gather_s")
        if every is None:
            return None
        return torch.cat([part[: self._shard_rows(self.rows, rank)] for rank, part in enumerate(every)])

    def stop(self) -> None:
        """Rank 0: the other ranks leave their loop and end."""
        self._send_header({"op": "stop"})

    # --- every rank -------------------------------------------------------------------------------------

    def minibatches(self, minibatch_size: int) -> int:
        """Minibatches per epoch: as many as one learner cuts the update's rows into; each rank cuts its shard
        into that many, so every rank takes the same number of steps."""
        return math.ceil(self.rows / minibatch_size)

    def average(
        self, parameters: list[torch.Tensor], parts: dict[str, float], steps: torch.Tensor | int
    ) -> dict[str, float]:
        """All-reduce this minibatch's gradients (in place) and loss parts, each rank's weighted by its `steps`
        (its masked mean's count): the whole minibatch's mean, as one learner computes it. One collective."""
        grads = [p.grad for p in parameters if p.grad is not None]
        weight = float(steps)
        values = torch.tensor([*parts.values(), 1.0], dtype=grads[0].dtype, device=grads[0].device)
        flat = torch.cat([*(g.reshape(-1) for g in grads), values]) * weight
        self._collective(lambda: dist.all_reduce(flat), "allreduce_s")
        flat /= flat[-1].clamp(min=1e-12)  # the steps of every rank's minibatch (at least one rank's is non-empty)
        for grad, part in zip(grads, flat.split([g.numel() for g in grads] + [len(values)]), strict=False):
            grad.copy_(part.view_as(grad))
        return dict(zip(parts, flat[-len(values) : -1].tolist(), strict=True))

    def extremes(
        self, stats: dict[str, float], largest: tuple[str, ...], smallest: tuple[str, ...]
    ) -> dict[str, float]:
        """`stats` with the values named in `largest` the largest of every rank's, those in `smallest` the
        smallest (a batch's max and min from its shards' own). One collective."""
        names, signs = largest + smallest, [1.0] * len(largest) + [-1.0] * len(smallest)  # the smallest: -max(-x)
        values = torch.tensor(
            [sign * stats[name] for name, sign in zip(names, signs, strict=True)],
            dtype=torch.float64,
            device=self.device,
        )
        self._collective(lambda: dist.all_reduce(values, op=dist.ReduceOp.MAX), "allreduce_s")
        return {**stats, **{name: sign * v for name, sign, v in zip(names, signs, values.tolist(), strict=True)}}

    def check_identical(self, module: torch.nn.Module) -> None:
        """GroupFailed unless every rank holds the same weights (sha256 of their bytes) as rank 0."""
        # Every tensor's bytes in one, so a GPU's weights come to the host in one copy (the digest is the same).
        weights = torch.cat([tensor.detach().reshape(-1).view(torch.uint8) for tensor in module.state_dict().values()])
        digest = hashlib.sha256(weights.cpu().numpy().tobytes())
        mine = torch.frombuffer(bytearray(digest.digest()), dtype=torch.uint8).to(self.device)
        everyone = [torch.empty_like(mine) for _ in range(self.size)]
        self._collective(lambda: dist.all_gather(everyone, mine), "check_s")
        differ = [rank for rank, theirs in enumerate(everyone) if not torch.equal(theirs, everyone[0])]
        if differ:
            raise GroupFailed(f"learner ranks {differ} hold other weights than rank 0 after an update")

    # --- plumbing ---------------------------------------------------------------------------------------

    def _shard_rows(self, rows: int, rank: int) -> int:
        """The rows of rank `rank`'s shard of `rows` (torch.tensor_split's: the first `rows % size` get one more)."""
        return rows // self.size + (rank < rows % self.size)

    def _padded(self, shard: torch.Tensor) -> torch.Tensor:
        """A shard filled up with zero rows to the largest shard's size, as a collective's tensors must be."""
        missing = math.ceil(self.rows / self.size) - len(shard)
        return torch.cat([shard, shard.new_zeros(missing, *shard.shape[1:])]) if missing else shard

    def _send_header(self, header: dict[str, Any], kind: str | None = None) -> None:
        data = torch.frombuffer(bytearray(json.dumps(header).encode()), dtype=torch.uint8).to(self.device)
        size = torch.tensor([len(data)], device=self.device)
        self._collective(lambda: (dist.broadcast(size, src=0), dist.broadcast(data, src=0)), kind)

    def _receive_header(self) -> dict[str, Any]:
        size = torch.zeros(1, dtype=torch.int64, device=self.device)
        self._collective(lambda: dist.broadcast(size, src=0))
        data = torch.empty(int(size), dtype=torch.uint8, device=self.device)
        self._collective(lambda: dist.broadcast(data, src=0))
        return json.loads(data.cpu().numpy().tobytes())

    def _collective(self, call: Any, kind: str | None = None) -> None:
        """Run torch.distributed calls, their seconds added to `seconds[kind]`; a peer that died or timed out
        raises GroupFailed naming this rank."""
        started = time.perf_counter()
        try:
            call()
        except RuntimeError as exc:  # gloo's "Connection closed by peer" is a bare RuntimeError, a timeout a DistError
            reason = " ".join(str(exc).split())[:200]
            raise GroupFailed(f"learner rank {self.rank} of {self.size}: the group broke: {reason}") from None
        self._last_collective = time.monotonic()
        if kind is not None:
            self.seconds[kind] = self.seconds.get(kind, 0.0) + time.perf_counter() - started


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise GroupFailed(f"rank 0 sent a column of unknown dtype {name!r}")
    return dtype


def _unpack(shard: torch.Tensor, skeleton: Any) -> dict[str, Any]:
    """The columns of a packed shard ([rows, bytes]), nested as `skeleton` (leaves: [dtype, trailing shape])."""
    leaves = flatten(skeleton)
    widths = [_dtype(dtype).itemsize * math.prod(shape) for dtype, shape in leaves]
    parts = shard.split(widths, dim=1)
    # Each part copied to storage of its own: a shard of one row (a small module's batch shared out) has parts that
    # are contiguous already, at byte offsets a wider dtype cannot view.
    tensors = iter(
        part.clone(memory_format=torch.contiguous_format).view(_dtype(dtype)).reshape(len(shard), *shape)
        for part, (dtype, shape) in zip(parts, leaves, strict=True)
    )
    return map_structure(lambda _: next(tensors), skeleton)


def fail(error: GroupFailed) -> None:
    """End this process at once, non-zero, with one line: a broken group has no consistent state to save (the
    learner resumes from its last checkpoint, and its intake files hold every chunk acknowledged since)."""
    log.critical("%s; the learner stops: restart it, it resumes from its last checkpoint", error)
    logging.shutdown()
    sys.stderr.flush()
    os._exit(FAILED)
