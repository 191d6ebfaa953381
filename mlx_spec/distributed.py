"""Speculation on a target sharded across processes with ``mx.distributed``.

Launched with ``mlx.launch`` (or Open MPI's ``mpirun``), every rank runs the
same loop: the target is sharded with mlx-lm's own ``shard()`` (tensor
parallel), its MLP alone where the attention heads do not divide by the
number of processes, or ``pipeline()`` (stages); the drafter is replicated,
and every rank takes part in each verification forward. The ranks stay in
step because every input to a decision is the same on all of them: the
target's logits (all-reduced), the random state (seeded alike), and the
measured round costs (rank 0's, broadcast). Only rank 0 prints, and an
error is said once for the group (:func:`exit_in_one_line`).
"""

import contextlib
import ctypes.util
import functools
import os
import sys
import time
from pathlib import Path
from typing import Iterator, Optional

import mlx.core as mx

# The collectives a sharded forward runs; a benchmark may slow each down.
COLLECTIVES = ("all_sum", "all_gather", "send", "recv", "recv_like")
# How long a rank other than 0 waits before it says an error (see _exit_from_rank0).
OTHERS_WAIT_S = 10.0
# What the ring backend says when a collective's peer has gone.
LOST_PEER = "connection to a peer was lost"
# Sharded, what rank 0 alone hears (a stop, a new request) is shared, by a
# collective that syncs, once in this many tokens: alike on every rank.
POLL_TOKENS = 8


def _point_mlx_at_open_mpi():
    """Under Open MPI's ``mpirun``, tell MLX which libmpi to open.

    MLX opens ``libmpi.so``, which Debian and Ubuntu ship only in
    libopenmpi-dev; without it each rank would run alone.
    """
    if "OMPI_COMM_WORLD_SIZE" in os.environ and "MLX_MPI_LIBNAME" not in os.environ:
        name = ctypes.util.find_library("mpi")
        if name:
            os.environ["MLX_MPI_LIBNAME"] = name


def _exit_from_rank0(rank: int, code: int, line: str, grouped: bool = False):
    """Exit ``code`` with ``line`` on stderr, said once for the group.

    Every rank usually meets the same error: rank 0 says it at once, and
    mlx.launch or mpirun stops the others while they wait. A rank that meets
    an error alone (a model missing on its Mac) says it after the wait,
    naming itself. A process of a ``grouped`` run leaves at once, without
    MPI's finalize: mpirun then stops the others (as mlx.launch does anyway),
    which would otherwise wait for it in a collective.
    """
    if rank != 0:
        time.sleep(OTHERS_WAIT_S)
        line = f"rank {rank}: {line}"
    print(line, file=sys.stderr)
    if grouped:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


def peer_lost(error: BaseException) -> bool:
    """Whether ``error`` is a collective that failed because another process
    of the group stopped."""
    return isinstance(error, RuntimeError) and LOST_PEER in str(error)


@functools.lru_cache(maxsize=1)
def sharded_group() -> Optional["mx.distributed.Group"]:
    """The world group when this process is one of several, else ``None``."""
    _point_mlx_at_open_mpi()
    group = mx.distributed.init() if mx.distributed.is_available() else None
    if group is not None and group.size() > 1:
        return group
    launched = int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1"))
    if launched > 1:  # else each rank would decode alone, unsharded
        _exit_from_rank0(
            int(os.environ.get("OMPI_COMM_WORLD_RANK", "0")),
            1,
            f"mlx_spec: mpirun started {launched} processes but MLX could not open "
            "Open MPI's library (libmpi); install openmpi-bin, or set "
            "MLX_MPI_LIBNAME to the path of its libmpi.so.",
        )
    return None


def rank() -> int:
    """This process's rank (0 when not sharded)."""
    group = sharded_group()
    return 0 if group is None else group.rank()


def rank0_prints():
    """Silence standard output on every rank but 0, which prints for the group."""
    if rank() != 0:
        sys.stdout = open(os.devnull, "w")


def exit_in_one_line(parser, error, code: int = 2):
    """Exit ``code`` with ``error`` on one line, said once for the group (1
    when another process of the group stopped, which said why, if it could)."""
    if peer_lost(error):
        error, code = f"another process of the group stopped ({error}).", 1
    grouped = sharded_group() is not None
    _exit_from_rank0(rank(), code, f"{parser.prog}: error: {error}", grouped)


@contextlib.contextmanager
def errors_in_one_line(parser, errors: tuple) -> Iterator[None]:
    """Turn ``errors`` and a lost process of the group into :func:`exit_in_one_line`."""
    try:
        yield
    except errors as e:
        exit_in_one_line(parser, e)
    except RuntimeError as e:
        if not peer_lost(e):
            raise
        exit_in_one_line(parser, e)


def summed_over_ranks(value: float, group) -> float:
    """The sum of every rank's ``value`` in ``group`` (as is for ``None``)."""
    if group is None:
        return value
    from mlx_lm.generate import generation_stream

    # On the forwards' stream, after any forward still queued there (plain
    # decoding queues its next step): every rank runs its collectives in one order.
    with mx.stream(generation_stream):
        return mx.distributed.all_sum(mx.array(value, mx.float32), group=group).item()


def from_rank0(value: float, group) -> float:
    """``value`` as rank 0 has it, on every rank of ``group`` (as is for ``None``)."""
    if group is None:
        return value
    return summed_over_ranks(value if group.rank() == 0 else 0.0, group)


def flag_from_rank0(flag: bool, group) -> bool:
    """Whether rank 0 has ``flag`` set, on every rank of ``group`` (as is for ``None``).

    Polled where every rank polls alike (as a stream's ``should_stop``, see
    :func:`tokens_per_poll`), it makes every rank act on an event rank 0
    alone sees at the same point: a server's client hanging up, Ctrl-C in chat.
    """
    return bool(from_rank0(float(flag), group))


def tokens_per_poll() -> int:
    """Tokens between two polls of rank 0's events (a stream's ``should_stop``,
    a server's new requests): 1, or sharded :data:`POLL_TOKENS`."""
    return 1 if sharded_group() is None else POLL_TOKENS


def text_from_rank0(text: Optional[str], group) -> Optional[str]:
    """``text`` as rank 0 has it (``None`` too), on every rank of ``group``.

    Its length goes first (-1 for ``None``), then its UTF-8 bytes; lone
    surrogates (invalid UTF-8 typed in) pass through as they are.
    """
    if group is None:
        return text
    from mlx_lm.generate import generation_stream

    data = b"" if text is None else text.encode("utf-8", "surrogatepass")
    length = int(from_rank0(-1.0 if text is None else float(len(data)), group))
    if length < 0:
        return None
    mine = list(data) if group.rank() == 0 else [0] * length
    with mx.stream(generation_stream):  # as from_rank0, in the forwards' order
        summed = mx.distributed.all_sum(mx.array(mine, mx.int32), group=group)
        return bytes(summed.tolist()).decode("utf-8", "surrogatepass")


def barrier():
    """Wait until every rank of the sharded run gets here (a no-op unsharded)."""
    from_rank0(0.0, sharded_group())


def shared_seed(seed: Optional[int]) -> Optional[int]:
    """A seed every rank shares: ``seed`` if given, else one drawn by rank 0."""
    group = sharded_group()
    if group is None or seed is not None:
        return seed
    drawn = int(time.time_ns() % (1 << 24))  # exact in float32
    return int(from_rank0(float(drawn), group))


def heads_split(config: dict, size: int) -> bool:
    """Whether ``size`` tensor-parallel shards split the attention heads evenly."""
    text = config.get("text_config", config)
    heads = text.get("num_attention_heads")
    kv_heads = text.get("num_key_value_heads", heads)
    return heads is None or (heads % size == 0 and kv_heads % size == 0)


def _gated_mlp(layer) -> Optional[tuple]:
    """``(mlp, inputs, segments)``: a layer's dense gated MLP and its input projections.

    ``inputs`` are the projections into the intermediate width (``gate_proj``
    and ``up_proj``, or the fused ``gate_up_proj`` made of 2 segments); the
    output projection is ``down_proj``. ``None`` when the layer has no such MLP.
    """
    mlp = getattr(layer, "mlp", None)
    if mlp is None or not hasattr(mlp, "down_proj"):
        return None
    if hasattr(mlp, "gate_proj") and hasattr(mlp, "up_proj"):
        return mlp, ("gate_proj", "up_proj"), 1
    if hasattr(mlp, "gate_up_proj"):
        return mlp, ("gate_up_proj",), 2
    return None


def shard_mlp(model, group, path: str = "the model"):
    """Split each layer's MLP over ``group``; attention stays whole on every rank.

    For targets whose attention heads do not divide by the number of processes
    (SmolLM2-135M: 9 heads, 3 key/value heads): the MLP's intermediate width
    usually does, and it holds most of a layer's weights. Each rank computes
    its slice of the intermediate width; ``down_proj`` all-sums the slices, one
    collective per layer. Uses mlx's ``shard_linear``, so quantized layers too.

    Raises:
        ValueError: when a layer has no dense gated MLP, or its intermediate
            width does not divide by the group size.
    """
    from mlx.nn.layers.distributed import shard_linear

    size = group.size()
    layers = getattr(model, "layers", None) or []
    found = [_gated_mlp(layer) for layer in layers]
    if not found or any(f is None for f in found):
        raise ValueError(
            f"{path} has attention heads that {size} processes cannot split, and "
            "no dense MLP in every layer to split instead; launch a number of "
            "processes that divides the heads, or pass --pipeline."
        )
    for mlp, inputs, segments in found:
        width = getattr(mlp, inputs[0]).weight.shape[0] // segments
        if width % size:
            raise ValueError(
                f"{path}: neither its attention heads nor its MLP width ({width}) "
                f"divide by {size} processes; launch a number of processes that "
                "divides one of them, or pass --pipeline."
            )
        for name in inputs:
            sharded = shard_linear(
                getattr(mlp, name), "all-to-sharded", segments=segments, group=group
            )
            setattr(mlp, name, sharded)
        mlp.down_proj = shard_linear(mlp.down_proj, "sharded-to-all", group=group)


def load_sharded(
    path: str, *, pipeline: bool = False, tokenizer_config: Optional[dict] = None
):
    """Load ``path`` sharded over the world group, as mlx-lm's ``sharded_load`` does.

    Tensor parallel (``model.shard``) by default, or the MLP alone
    (:func:`shard_mlp`) when mlx-lm cannot shard the model or its attention
    heads do not divide by the number of processes; ``pipeline`` gives each rank a
    range of layers (``model.model.pipeline``, DeepSeek-style families). A
    local folder needs no weight index; in pipeline stages a hub repo goes
    through ``sharded_load`` so that each rank fetches only its stage.

    Returns:
        ``(model, tokenizer)``.
    """
    from mlx_lm.utils import load_model, load_tokenizer, sharded_load

    from .mlx_lm_private import download

    group = sharded_group()
    if group is None:
        raise ValueError(
            "a sharded load needs several processes: start it with mlx.launch "
            "(for example mlx.launch --backend ring -n 2 -- mlx_spec.generate ...)."
        )
    local = Path(path).expanduser()
    if not local.is_dir():
        try:
            if pipeline:
                model, tokenizer = sharded_load(
                    path, group, None, tokenizer_config=tokenizer_config
                )
                list_every_block(model, group)
                return model, tokenizer
            # Each rank reads every weight (as sharded_load would): the local
            # path below then checks how the heads split.
            local = download(path)
        except Exception as e:  # hub errors are long; keep the first line
            first = (
                str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            )
            raise ValueError(
                f"could not load a sharded model '{path}': {first}"
            ) from None
    model, config = load_model(local, lazy=True, strict=False)
    if pipeline:
        if not hasattr(getattr(model, "model", None), "pipeline"):
            raise ValueError(
                f"{path} ({config.get('model_type')}) has no pipeline stages in "
                "mlx-lm; drop --pipeline to shard it tensor-parallel."
            )
        model.model.pipeline(group)
    elif hasattr(model, "shard") and heads_split(config, group.size()):
        model.shard(group)
    else:
        shard_mlp(model, group, path)
    mx.eval(model.parameters())
    tokenizer = load_tokenizer(
        local, tokenizer_config or {}, eos_token_ids=config.get("eos_token_id")
    )
    if pipeline:
        list_every_block(model, group)  # and every rank has loaded
    else:  # every rank has loaded before the first forward
        with mx.stream(mx.cpu):
            mx.eval(mx.distributed.all_sum(mx.array(1.0), group=group))
    return model, tokenizer


def list_every_block(model, group):
    """List all blocks on each pipeline stage, ``None`` for those another
    stage holds (mlx-lm lists those before a stage's own only).

    A head's feature layers (EAGLE-3's low, middle and high blocks) then name
    the same blocks on every rank. Counting the stages' blocks waits for every rank.
    """
    inner = model.model
    held = float(len(inner.pipeline_layers))
    with mx.stream(mx.cpu):
        count = int(mx.distributed.all_sum(mx.array(held), group=group).item())
    inner.layers += [None] * (count - len(inner.layers))


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
