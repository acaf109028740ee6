"""The learning algorithm: loss math, advantages, logprobs, batch assembly, the jitted step, the optimizer."""
