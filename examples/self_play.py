"""A per-episode policy mapping for two-player games: the trained module "main" against itself or a frozen one.

    [multi_agent]
    policies = ["main", "random"]
    policies_to_train = ["main"]
    policy_mapping_fn = "examples.self_play:main_vs_random"

Pure self-play never shows "main" the threats a weak player leaves open, so it does not learn to punish them
(examples/README.md). As RLlib's self_play_with_open_spiel.py example does, most games here pit "main" against
"random", a module that never trains: with the action-masking module its initial weights pick nearly
uniformly among the legal moves. Each game is drawn from its episode id (the same on every call, server or
process): with probability SELF_PLAY both seats are "main", otherwise one seat, drawn evenly, is "main" and
the other "random". A seat is told by the parity of the number its agent id ends in (tic-tac-toe's
player_1/player_2, connect four's player_0/player_1).
"""

from __future__ import annotations

import random
from typing import Any

#: The share of games in which "main" plays both seats.
SELF_PLAY = 0.2


def main_vs_random(agent_id: str, episode: Any, **kwargs: Any) -> str:
    """The module of this agent in this episode, "main" or "random" (drawn once per episode from its id)."""
    draw = random.Random(episode.id_)  # str seeds are hashed with SHA-512: the same in every process
    if draw.random() < SELF_PLAY:
        return "main"
    seat = int(agent_id.rsplit("_", 1)[-1]) % 2
    return "main" if seat == draw.randrange(2) else "random"
