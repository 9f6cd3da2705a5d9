"""What a learner's checkpoints say and when they come: chunks dropped as too stale are listed apart from the
chunks trained (the trained ones' steps add up to the env steps trained), and a checkpoint follows the first
update of a process and then every `checkpoint_every` versions or `checkpoint_every_s` seconds."""

from __future__ import annotations

import json

from support.batches import episode_batch
from support.learners import submit
from support.servers import until

from rlgate.learner.batch_decoder import chunk_key
from rlgate.learner.main import LearnerServer
from rlgate.storage import checkpoint

RARELY = {"checkpoint_every": 1000, "checkpoint_every_s": 3600.0}


def versions(server: LearnerServer) -> list[str]:
    """The checkpoints written so far, by folder name."""
    return sorted(p.name for p in server.settings.checkpoint_dir.glob("v*"))


async def test_a_checkpoint_lists_chunks_dropped_as_stale_apart_from_chunks_trained(
    learner_settings, cartpole_chunks
) -> None:
    server = LearnerServer(learner_settings(max_staleness=0, **RARELY))
    await server.start()
    try:
        learner = server.learner
        size = learner.spec.algorithm.train_batch_size
        fresh = cartpole_chunks(size, seed=1)
        await submit(server, episode_batch(fresh, seq=1))
        await until(lambda: learner.trainer.version == 1, timeout=30)
        # Chosen by version 0 too: too old for version 1, as is the rest of a fresh chunk the update split.
        stale = cartpole_chunks(size // 2, seed=2)
        await submit(server, episode_batch(stale, seq=2))
        dropped = sum(map(len, fresh + stale)) - size
        await until(lambda: learner.stale_steps == dropped, timeout=30)
        final = checkpoint.load(await learner.save_checkpoint())
    finally:
        await server.stop()
    keys = {chunk_key(c.id_, c.chunk_index): len(c) for c in fresh + stale}
    split = [key for key in keys if key in final.partial_chunks]
    assert set(final.stale_chunks) == {chunk_key(c.id_, c.chunk_index) for c in stale} | set(split)
    assert not set(final.trained_chunks) & set(final.stale_chunks)
    trained = sum(keys[key] for key in final.trained_chunks) + sum(final.partial_chunks.values())
    assert trained == final.env_steps == size


async def test_a_learner_checkpoints_after_its_first_update(learner_settings, train_updates) -> None:
    """Not only at version `checkpoint_every`: a learner killed before it would have lost every update."""
    server = LearnerServer(learner_settings(**RARELY))
    await server.start()
    try:
        await train_updates(server, 2)  # the first update's checkpoint is written before the second update runs
        written = versions(server)
    finally:
        await server.stop()
    assert written == ["v000001"]


async def test_a_learner_checkpoints_when_its_last_checkpoint_is_checkpoint_every_s_old(
    learner_settings, train_updates
) -> None:
    server = LearnerServer(learner_settings(checkpoint_every=1000, checkpoint_every_s=1e-6))
    await server.start()
    try:
        await train_updates(server, 3)
        written = versions(server)
    finally:
        await server.stop()
    assert {"v000001", "v000002"} <= set(written)  # the third update's may still be on its way
    metadata = json.loads((server.settings.checkpoint_dir / "v000002" / "metadata.json").read_text())
    assert metadata["env_steps"] == 2 * server.learner.spec.algorithm.train_batch_size
