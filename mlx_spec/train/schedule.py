"""The learning-rate schedule the trainers share."""

import mlx.optimizers as optim


def peak_schedule(peak: float, warmup: int, steps: int, floor: float = 0.1):
    """Linear warm-up from 1% of ``peak`` over ``warmup`` steps, then cosine
    decay to ``floor`` × ``peak`` at step ``steps``."""
    return optim.join_schedules(
        [
            optim.linear_schedule(peak * 0.01, peak, warmup),
            optim.cosine_decay(peak, max(steps - warmup, 1), peak * floor),
        ],
        [warmup],
    )
