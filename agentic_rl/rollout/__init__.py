"""Rollout: one trajectory's turn loop, the concurrent runner, the wrapper API, rewards and token bookkeeping."""
