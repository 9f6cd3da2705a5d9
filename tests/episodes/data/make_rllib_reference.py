"""Writes rllib_multi_agent_episode.json: RLlib 2.60's MultiAgentEpisode on the scripted traces.

Run with RLlib installed (never a dependency of rlgate, so it lives outside the suite), from the
repository root: `python tests/episodes/data/make_rllib_reference.py` with ray[rllib]==2.60.0 in the venv.
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "support"))

from agent_traces import replay, summary, trace
from ray.rllib.env.multi_agent_episode import MultiAgentEpisode

SEEDS = range(16)

reference = {}
for seed in SEEDS:
    for numpy in (False, True):
        episode = replay(MultiAgentEpisode(), trace(seed))
        reference[f"{seed}-{'numpy' if numpy else 'list'}"] = summary(episode.to_numpy() if numpy else episode)
Path(__file__).with_name("rllib_multi_agent_episode.json").write_text(json.dumps(reference, indent=0) + "\n")
