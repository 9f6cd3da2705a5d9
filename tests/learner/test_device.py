"""The learner's `--device`: how a setting becomes this process's torch device (auto, data-parallel ranks), which
backend data-parallel ranks use on it, and that `--device cpu` trains as the default does. CUDA is faked here (the
machines that run the suite have none): tests/learner/test_cuda.py trains on a real GPU where there is one."""

from __future__ import annotations

import pytest
import torch
from support.servers import until

from rlgate.core.errors import UserError
from rlgate.learner.data_parallel import backend_for
from rlgate.learner.device import learner_device, training_device
from rlgate.learner.main import LearnerServer
from rlgate.service.settings import require_device, resolve_device


@pytest.fixture
def two_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch sees two GPUs (cuda:0, cuda:1); nothing is put on them."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a torch without CUDA")
def test_auto_is_the_cpu_where_torch_sees_no_gpu(learner_settings) -> None:
    assert training_device("auto") == torch.device("cpu")
    assert learner_device(learner_settings(device="auto")) == torch.device("cpu")
    assert learner_device(learner_settings()) == torch.device("cpu")  # the default: cpu, as before --device


@pytest.mark.usefixtures("two_gpus")
def test_auto_is_cuda_where_torch_sees_a_gpu() -> None:
    assert resolve_device("auto") == "cuda"
    assert training_device("auto") == torch.device("cuda")
    assert training_device("cuda:1") == torch.device("cuda:1")


@pytest.mark.usefixtures("two_gpus")
def test_a_gpu_that_is_not_there_is_refused() -> None:
    with pytest.raises(UserError, match=r"^--device cuda:2: torch sees 2 GPUs here, numbered from cuda:0$"):
        require_device("cuda:2")


@pytest.mark.usefixtures("two_gpus")
def test_data_parallel_ranks_each_take_the_gpu_of_their_local_rank(learner_settings, monkeypatch) -> None:
    assert training_device("cuda", local_rank=1) == torch.device("cuda:1")
    assert training_device("auto", local_rank=0) == torch.device("cuda:0")
    assert training_device("cpu", local_rank=1) == torch.device("cpu")
    with pytest.raises(UserError, match=r"^--device cuda:1: data-parallel learners each train on cuda:LOCAL_RANK"):
        training_device("cuda:1", local_rank=0)
    with pytest.raises(UserError, match=r"^--device cuda:2: .* \(--device cuda puts LOCAL_RANK 2 on cuda:2\)$"):
        training_device("cuda", local_rank=2)
    # torchrun's rank 1 on its node; rank 0 of --num-learners 2 (the ranks it starts: cuda:1).
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert learner_device(learner_settings(device="cuda")) == torch.device("cuda:1")
    monkeypatch.delenv("WORLD_SIZE")
    monkeypatch.delenv("LOCAL_RANK")
    assert learner_device(learner_settings(device="cuda", num_learners=2)) == torch.device("cuda:0")


@pytest.mark.usefixtures("two_gpus")
def test_rank_0_refuses_more_local_ranks_than_gpus(learner_settings) -> None:
    with pytest.raises(UserError, match=r"^--num-learners 3 --device cuda: each rank trains on a GPU of its own"):
        learner_device(learner_settings(device="cuda", num_learners=3))
    assert learner_device(learner_settings(device="cpu", num_learners=3)) == torch.device("cpu")  # gloo: any number


def test_ranks_on_cuda_use_nccl_and_on_the_cpu_gloo() -> None:
    assert backend_for(torch.device("cuda")) == backend_for(torch.device("cuda:3")) == "nccl"
    assert backend_for(torch.device("cpu")) == "gloo"


async def test_device_cpu_publishes_the_weights_the_default_does(learner_settings, train_updates, tmp_path) -> None:
    """`--device cpu` given is the default (no --device): the same seeded run publishes the same bytes."""

    async def published(**device: str) -> tuple[int, bytes]:
        server = LearnerServer(learner_settings(checkpoint_dir=tmp_path / str(device), **device))
        await server.start()
        try:
            await train_updates(server, 2)
            await until(lambda: server.learner.weights.version == 2, 10)  # published after its stats are recorded
            return server.learner.weights.version, server.learner.weights.safetensors
        finally:
            await server.stop()

    assert await published() == await published(device="cpu")
