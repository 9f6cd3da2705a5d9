"""Envs as rlgate steps them: PettingZoo ParallelEnv and AECEnv adapters giving multi-agent steps."""
