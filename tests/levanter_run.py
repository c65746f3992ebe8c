"""A tiny training loop driven through Levanter's own config and tracker machinery (run in .tools/levanter).

Usage: python tests/levanter_run.py CONFIG.yaml RUN_ID STEPS LEARNING_RATE

CONFIG.yaml is a Levanter `TrainerConfig` (draccus parses it, as Levanter's
entry points do); its `tracker:` list names the lossspike tracker. The global
tracker is built by `levanter.trainer._initialize_global_tracker`, the function
`TrainerConfig.initialize` calls, metrics go through `levanter.tracker.log`
as the trainer's callbacks send them (JAX arrays, `train/loss` among them), and
the run ends with the tracker's `finish()` as `levanter.main.train_lm` ends.

The model is a linear regression on synthetic data, stepped by jax.grad: a
small learning rate converges, a large one diverges to inf and then NaN, a real
loss going non-finite.
"""

from __future__ import annotations

import sys

import draccus
import jax
import jax.numpy as jnp
import levanter.tracker
from levanter.trainer import TrainerConfig, _initialize_global_tracker

import lossspike.levanter_tracker  # noqa: F401 - registers tracker type "lossspike"


def main(config_path: str, run_id: str, steps: int, learning_rate: float) -> None:
    config = draccus.parse(config_class=TrainerConfig, config_path=config_path, args=[])
    _initialize_global_tracker(config.tracker, run_id)
    tracker = levanter.tracker.current_tracker()

    key_x, key_w = jax.random.split(jax.random.PRNGKey(0))
    inputs = jax.random.normal(key_x, (64, 8))
    targets = inputs @ jax.random.normal(key_w, (8,))
    weights = jnp.zeros(8)

    def loss_fn(w: jax.Array) -> jax.Array:
        return jnp.mean((inputs @ w - targets) ** 2)

    step_fn = jax.jit(jax.value_and_grad(loss_fn))
    for step in range(steps):
        loss, grad = step_fn(weights)
        weights = weights - learning_rate * grad
        levanter.tracker.log(
            {
                "train/loss": loss,
                "grad/norm/total": jnp.linalg.norm(grad),
                "optim/learning_rate": learning_rate,
                "global_step": step,
            },
            step=step,
        )
    tracker.finish()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]))
