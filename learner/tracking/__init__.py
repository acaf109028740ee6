"""Experiment trackers beside TensorBoard (W&B, trackio): each optional, off by default, failing soft."""
