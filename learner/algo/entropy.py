"""The entropy bonus of the RL loss and its coefficient, fixed or adaptive (`algo.entropy_coef`,
`algo.entropy_target`).

The bonus (the entropy regulariser of A3C / PPO, Mnih et al. 2016, Schulman et al. 2017) subtracts the
policy's entropy over the completion tokens, aggregated as the policy loss is:

    H_t  = −Σ_v π(v | y_<t) log π(v | y_<t),     π = softmax(logits / T)   (float32, the full vocabulary)
    loss = aggregate(policy terms) − α · aggregate(H)

π is the distribution the actors sampled from (temperature T, as the loss's log-probabilities), so a
collapsed policy, whose groups all answer the same and carry no signal, is pushed to sample other answers.

The adaptive coefficient is Skywork-OR1's adaptive entropy control (He et al. 2025, arXiv 2505.22312,
"Adaptive Entropy Control"), with target entropy `tgt` and step Δ:

    c_{k+1} = max(0, c_k + Δ) if e_k < tgt,   max(0, c_k − Δ) if e_k > tgt,   c_0 = algo.entropy_coef
    α_k     = c_k · 1[e_k ≤ tgt]

where e_k is update k's token-mean entropy. The paper reads e_k from the update's own batch; here the
coefficient enters the compiled step as an input, so α_k uses the entropy the previous update measured
(e_{k−1}; c_0 on the first): one update of lag, which only a step that moves the entropy across the
target feels. The controller's state is the learner process's: a resumed run starts again from c_0.
"""

from __future__ import annotations

from learner.schema import LossConfig


class EntropyControl:
    """The entropy bonus's coefficient α for each update (module docstring): `entropy_coef`, or with
    `entropy_target` Skywork-OR1's rule driven by the entropies the updates report (`observe`)."""

    def __init__(self, config: LossConfig):
        self.target, self.step = config.entropy_target, config.entropy_coef_step
        self.c = config.entropy_coef
        self.last_entropy: float | None = None

    @property
    def coef(self) -> float:
        """α of the next update."""
        if self.target is None or self.last_entropy is None or self.last_entropy <= self.target:
            return self.c
        return 0.0

    def observe(self, entropy: float) -> None:
        """Update the controller with an update's token-mean entropy e_k."""
        self.last_entropy = entropy
        if self.target is None:
            return
        if entropy < self.target:
            self.c += self.step
        elif entropy > self.target:
            self.c = max(0.0, self.c - self.step)


def enabled(config: LossConfig) -> bool:
    """Whether the loss has an entropy term at all (else the step leaves the entropy's gradient out)."""
    return config.entropy_coef > 0.0 or config.entropy_target is not None
