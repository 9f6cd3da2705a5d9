"""Returns of episodes that never end (their client left after a cut, their server crashed): the learner keeps
summing at most `max_running` of them, forgets the one that waited longest, and counts every other episode right."""

from __future__ import annotations

from collections import defaultdict

from support.batches import episode_batch
from support.learners import submit

from rlgate.episodes import SingleAgentEpisode


def whole_episodes(chunks: list[SingleAgentEpisode]) -> list[list[SingleAgentEpisode]]:
    """The episodes all of whose chunks are here, cut at least once, each as its chunks in order."""
    by_id: dict[str, list[SingleAgentEpisode]] = defaultdict(list)
    for chunk in chunks:
        by_id[chunk.id_].append(chunk)
    return [
        episode
        for episode in by_id.values()
        if len(episode) > 1 and episode[-1].is_done and [c.chunk_index for c in episode] == list(range(len(episode)))
    ]


async def test_never_finished_episodes_stay_bounded_and_a_later_episode_counts_right(learner_server, cartpole_chunks):
    intake = learner_server.learner.intake
    intake.max_running = 3
    chunks = cartpole_chunks(150)
    forgotten, counted = whole_episodes(chunks)[:2]
    never = episode_batch([next(c for c in chunks if c.chunk_index == 0 and not c.is_done)] * 6, seq=2)
    never.chunks[0].ids[:] = [f"never-{i}" for i in range(6)]  # six episodes whose first chunk alone comes
    acks = await submit(
        learner_server,
        episode_batch(forgotten[:-1], seq=1),  # its end comes only after the six above
        never,
        episode_batch(forgotten[-1:], seq=3),
        episode_batch(counted, seq=4),
    )
    assert [ack.accepted for ack in acks] == [len(forgotten) - 1, 6, 1, len(counted)]
    # At most three running at any time: the newest never-ending ones (the counted episode had the third place
    # while it ran).
    assert set(intake._running) == {"never-4", "never-5"}
    # The forgotten episode is not counted with the return of its end alone; the later one is counted whole.
    assert intake.episodes_finished == 1
    assert list(intake.returns) == [sum(c.get_return() for c in counted)]
    assert list(intake.lengths) == [sum(len(c) for c in counted)]
