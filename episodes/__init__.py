"""Episodes as RLlib 2.60 defines them (Single- and MultiAgentEpisode, InfiniteLookbackBuffer), and their wire codec."""

from rlgate.episodes.infinite_lookback_buffer import InfiniteLookbackBuffer
from rlgate.episodes.multi_agent_episode import MultiAgentEpisode
from rlgate.episodes.single_agent_episode import SingleAgentEpisode

__all__ = ["InfiniteLookbackBuffer", "MultiAgentEpisode", "SingleAgentEpisode"]
