"""Where a learner process trains: its `--device` setting resolved for this process (auto, data-parallel ranks).

A single learner trains on the device it is given (auto: cuda where torch sees a GPU, else cpu). Data-parallel
ranks on CUDA each take cuda:LOCAL_RANK, one GPU per rank, as NCCL wants (two ranks on one GPU are refused by it);
rank 0 of `rlgate learn --num-learners N`, which starts the other ranks on its own host, checks that the host has
the N GPUs they will take before it starts any.
"""

from __future__ import annotations

import os

import torch

from rlgate.core.errors import UserError
from rlgate.learner.settings import LearnerSettings
from rlgate.service.settings import require_device, resolve_device


def training_device(device: str, local_rank: int | None = None) -> torch.device:
    """The torch device for the `device` setting; `local_rank`: this process's LOCAL_RANK among data-parallel
    ranks (None: a single learner), whose CUDA device is cuda:LOCAL_RANK. UserError (one line) where CUDA, or
    that GPU, is not there."""
    resolved = resolve_device(device)
    if local_rank is not None and resolved.startswith("cuda"):
        if resolved != "cuda":
            raise UserError(
                f"--device {device}: data-parallel learners each train on cuda:LOCAL_RANK, one GPU per rank; "
                "pass --device cuda"
            )
        resolved = f"cuda:{local_rank}"
    try:
        require_device(resolved)
    except UserError as exc:
        if resolved == device:
            raise
        raise UserError(f"{exc} (--device {device} puts LOCAL_RANK {local_rank} on {resolved})") from None
    return torch.device(resolved)


def learner_device(settings: LearnerSettings) -> torch.device:
    """The device this learner process trains on: a single learner's setting, or a data-parallel rank's GPU
    (torchrun's LOCAL_RANK and WORLD_SIZE, or rank 0 of `--num-learners N`, LOCAL_RANK 0). UserError if it
    is not there, or, for rank 0 of `--num-learners N` on CUDA, if the N GPUs its ranks take are not."""
    size = int(os.environ.get("WORLD_SIZE", settings.num_learners))
    if size <= 1:
        return training_device(settings.device)
    device = training_device(settings.device, local_rank=int(os.environ.get("LOCAL_RANK", "0")))
    count = torch.cuda.device_count() if device.type == "cuda" else size
    if "WORLD_SIZE" not in os.environ and count < size:  # rank 0 of --num-learners N: ranks 1..N-1 start here
        raise UserError(
            f"--num-learners {size} --device {settings.device}: each rank trains on a GPU of its own "
            f"(cuda:0 to cuda:{size - 1}), and torch sees {count} here"
        )
    return device


def module_device(module: torch.nn.Module) -> torch.device:
    """The device a module's parameters are on (the learner's), for the tensors its learner makes beside them."""
    return next(module.parameters()).device
