"""Speculation on a target sharded across processes with ``mx.distributed``.

Launched with ``mlx.launch``, every rank runs the same loop: the target is
sharded with mlx-lm's own ``shard()`` (tensor parallel) or ``pipeline()``
(stages), the drafter is replicated, and every rank takes part in each
verification forward. The ranks stay in step because every input to a
decision is the same on all of them: the target's logits (all-reduced), the
random state (seeded alike), and the measured round costs (rank 0's,
broadcast). Only rank 0 prints.
"""

import contextlib
import functools
import os
import sys
import time
from pathlib import Path
from typing import Iterator, Optional

import mlx.core as mx

# The collectives a sharded forward runs; a benchmark may slow each down.
COLLECTIVES = ("all_sum", "all_gather", "send", "recv", "recv_like")


@functools.lru_cache(maxsize=1)
def sharded_group() -> Optional["mx.distributed.Group"]:
    """The world group when this process is one of several, else ``None``."""
    if not mx.distributed.is_available():
        return None
    group = mx.distributed.init()
    return group if group.size() > 1 else None


def rank() -> int:
    """This process's rank (0 when not sharded)."""
    group = sharded_group()
    return 0 if group is None else group.rank()


def rank0_prints():
    """Silence standard output on every rank but 0, which prints for the group."""
    if rank() != 0:
        sys.stdout = open(os.devnull, "w")


def exit_in_one_line(parser, error: Exception):
    """Exit 2 with ``error`` on one line, said by rank 0 alone.

    Every rank meets the same error; the others give rank 0 time to say it
    before mlx.launch stops the group.
    """
    if rank() != 0:
        time.sleep(2.0)
    parser.exit(2, f"{parser.prog}: error: {error}\n" if rank() == 0 else None)


def from_rank0(value: float, group) -> float:
    """``value`` as rank 0 has it, on every rank of ``group`` (as is for ``None``)."""
    if group is None:
        return value
    mine = value if group.rank() == 0 else 0.0
    # On the default stream, after the forwards queued there: collectives
    # must run in the same order on every rank.
    return mx.distributed.all_sum(mx.array(mine, mx.float32), group=group).item()


def shared_seed(seed: Optional[int]) -> Optional[int]:
    """A seed every rank shares: ``seed`` if given, else one drawn by rank 0."""
    group = sharded_group()
    if group is None or seed is not None:
        return seed
    drawn = int(time.time_ns() % (1 << 24))  # exact in float32
    return int(from_rank0(float(drawn), group))


def _check_splittable(config: dict, size: int, path: str):
    """A one-line error when ``size`` tensor-parallel shards cannot split the heads."""
    text = config.get("text_config", config)
    heads = text.get("num_attention_heads")
    kv_heads = text.get("num_key_value_heads", heads)
    if heads is None:
        return
    if heads % size or kv_heads % size:
        raise ValueError(
            f"{path} has {heads} attention heads and {kv_heads} key/value heads, "
            f"which {size} tensor-parallel processes cannot split evenly; launch a "
            "number of processes that divides both, or pass --pipeline."
        )


def load_sharded(
    path: str, *, pipeline: bool = False, tokenizer_config: Optional[dict] = None
):
    """Load ``path`` sharded over the world group, as mlx-lm's ``sharded_load`` does.

    Tensor parallel (``model.shard``) by default; ``pipeline`` gives each rank a
    range of layers (``model.model.pipeline``, DeepSeek-style families). A
    local folder needs no weight index; a hub repo goes through ``sharded_load``
    so that each rank fetches only its part.

    Returns:
        ``(model, tokenizer)``.
    """
    from mlx_lm.utils import load_model, load_tokenizer, sharded_load

    group = sharded_group()
    if group is None:
        raise ValueError(
            "a sharded load needs several processes: start it with mlx.launch "
            "(for example mlx.launch --backend ring -n 2 -- mlx_spec.generate ...)."
        )
    local = Path(path).expanduser()
    if not local.is_dir():
        groups = (group, None) if pipeline else (None, group)
        try:
            return sharded_load(path, *groups, tokenizer_config=tokenizer_config)
        except Exception as e:
            raise ValueError(f"could not load a sharded model '{path}': {e}") from None
    model, config = load_model(local, lazy=True, strict=False)
    if pipeline:
        if not hasattr(getattr(model, "model", None), "pipeline"):
            raise ValueError(
                f"{path} ({config.get('model_type')}) has no pipeline stages in "
                "mlx-lm; drop --pipeline to shard it tensor-parallel."
            )
        model.model.pipeline(group)
    else:
        if not hasattr(model, "shard"):
            raise ValueError(
                f"{path} ({config.get('model_type')}) cannot be sharded tensor-"
                "parallel by mlx-lm; try --pipeline."
            )
        _check_splittable(config, group.size(), path)
        model.shard(group)
    mx.eval(model.parameters())
    tokenizer = load_tokenizer(
        local, tokenizer_config or {}, eos_token_ids=config.get("eos_token_id")
    )
    # Every rank has loaded before the first forward.
    with mx.stream(mx.cpu):
        mx.eval(mx.distributed.all_sum(mx.array(1.0), group=group))
    return model, tokenizer


@contextlib.contextmanager
def collective_delay(seconds: float) -> Iterator[None]:
    """Make each collective wait ``seconds`` first, as a slower link would.

    The collective's input is evaluated, then the process sleeps: a forward
    pays the delay once per collective whatever its token count, which is what
    speculation amortises. For benchmarks only.
    """
    if seconds <= 0:
        yield
        return
    originals = {name: getattr(mx.distributed, name) for name in COLLECTIVES}

    def delayed(original):
        def call(x, *args, **kwargs):
            if isinstance(x, mx.array):
                mx.eval(x)
            time.sleep(seconds)
            return original(x, *args, **kwargs)

        return call

    for name, original in originals.items():
        setattr(mx.distributed, name, delayed(original))
    try:
        yield
    finally:
        for name, original in originals.items():
            setattr(mx.distributed, name, original)
