"""Tree attention on unmodified mlx-lm models.

Verifies a whole token tree (or expands a whole level of a draft tree) in one
forward pass, without forking any model file. Two small hooks do it:

- Each attention layer's ``rope`` is wrapped once by :func:`prepare_tree_model`
  in a :class:`TreeRoPE`. Outside tree mode it forwards its arguments unchanged,
  so normal decoding is bit-identical.
- During :func:`masked_forward` every layer cache is seen through a thin view
  that delegates to the real ``KVCache`` / ``QuantizedKVCache`` (so
  ``update_and_fetch`` and ``hasattr(cache, "bits")`` behave as usual) but
  whose ``offset`` carries per-token positions to the rope wrapper and whose
  ``make_mask`` returns the tree mask.

The wrapped rope rotates each token as its own batch row, because
``mx.fast.rope`` accepts one offset per batch row.

Terms: the *prefix* is what the cache holds before the tree; the tree's nodes
are stored in *flattened* (topological) order, parents before children.

Typical round (``P`` = cache length, nothing here syncs with the host)::

    prepare_tree_model(target)                      # once
    tree = Tree.from_parents(tokens, parents)       # or from_choices / grow
    logits = tree_forward(target, cache, tree)      # (N, V), cache at P + N
    ...accept on device; one sync gives the accepted node and its depth...
    commit_path(cache, P, tree.path(node, depth + 1))   # cache at P + depth + 1

A drafter grows its tree one level per forward: ``tree = tree.grow(tok, par)``
then ``tree_forward(draft, draft_cache, tree, start=old_size)``, and sends
``tree.subtree(best_nodes)`` to the target.
"""

import math
from dataclasses import dataclass
from typing import Any, List, Optional, Sequence, Tuple, Union

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx_lm.generate import maybe_quantize_kv_cache
from mlx_lm.models.cache import KVCache, QuantizedKVCache
from mlx_lm.models.rope_utils import (
    Llama3RoPE,
    ProportionalRoPE,
    SuScaledRoPE,
    YarnRoPE,
)

# ``model_type`` values whose attention calls ``self.rope(x, offset=cache.offset)``
# and whose mask comes from ``create_attention_mask(h, cache[...])``.
SUPPORTED_ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3", "gemma", "phi3")

# Rope modules that only pass ``offset`` through to ``mx.fast.rope`` (so an
# array of positions is valid). ``DynamicNTKScalingRoPE`` does int arithmetic.
_SUPPORTED_ROPES = (nn.RoPE, Llama3RoPE, SuScaledRoPE, YarnRoPE, ProportionalRoPE)
_SUPPORTED_CACHES = (KVCache, QuantizedKVCache)

IntList = Union[Sequence[int], mx.array]


@dataclass(frozen=True, eq=False)
class Tree:
    """A token tree in flattened topological order (every parent precedes its children).

    Build it with :meth:`from_parents` or :meth:`from_choices`, extend it with
    :meth:`grow` and prune it with :meth:`subtree`. All fields are device
    arrays and none of these sync with the host.

    Attributes:
        tokens: ``(N,)`` token ids, one per node.
        parents: ``(N,)`` int32 index of each node's parent, ``-1`` for roots
            (several roots make a forest; each root follows the prefix directly).
        depth: ``(N,)`` int32 distance to the node's root (roots have 0).
        ancestor_mask: ``(N, N)`` bool, ``[i, j]`` is True iff node ``j`` is an
            ancestor of node ``i`` or ``i`` itself.
    """

    tokens: mx.array
    parents: mx.array
    depth: mx.array
    ancestor_mask: mx.array

    @property
    def size(self) -> int:
        """Number of nodes ``N``."""
        return self.tokens.shape[0]

    @classmethod
    def from_parents(cls, tokens: IntList, parents: IntList) -> "Tree":
        """Build a tree from per-node parents.

        Args:
            tokens: ``(N,)`` token ids.
            parents: ``(N,)`` parent index per node, ``-1`` for a root. Each
                parent must precede its child (``parents[i] < i``); this is
                checked only when ``parents`` is a Python sequence.

        Returns:
            The :class:`Tree`.
        """
        tokens = _as_array(tokens)
        if isinstance(parents, mx.array):
            ancestors = _ancestor_mask(parents.astype(mx.int32))
            depth = ancestors.astype(mx.int32).sum(axis=1) - 1
        else:  # host parents: build the structure on the host, no device work
            parents, depth, ancestors = _host_structure(list(parents))
        parents = mx.array(parents, dtype=mx.int32)
        if tokens.ndim != 1 or tokens.size == 0 or parents.shape != tokens.shape:
            raise ValueError(
                f"tokens {tuple(tokens.shape)} and parents {tuple(parents.shape)} "
                "must both have shape (N,) with N >= 1."
            )
        return cls(tokens, parents, mx.array(depth, mx.int32), mx.array(ancestors))

    def with_root(self, token: Union[int, mx.array]) -> "Tree":
        """Put a new root node 0 above this tree (its roots become its children).

        Used to verify a draft tree: the root is the last accepted token,
        whose K/V the target has not cached yet. Lazy and cheap: the ancestor
        mask is extended, not recomputed.

        Args:
            token: the root's token id (an int or a ``(1,)`` / scalar array).

        Returns:
            A :class:`Tree` with ``N + 1`` nodes; node ``i + 1`` is node ``i``.
        """
        n = self.size
        root = _as_array(token).astype(self.tokens.dtype).reshape(1)
        top = mx.concatenate([mx.ones((1, 1), mx.bool_), mx.zeros((1, n), mx.bool_)], 1)
        rows = mx.concatenate([mx.ones((n, 1), mx.bool_), self.ancestor_mask], 1)
        return Tree(
            mx.concatenate([root, self.tokens]),
            mx.concatenate(
                [
                    mx.array([-1], mx.int32),
                    mx.where(self.parents < 0, 0, self.parents + 1),
                ]
            ),
            mx.concatenate([mx.array([0], mx.int32), self.depth + 1]),
            mx.concatenate([top, rows], 0),
        )

    @classmethod
    def from_choices(
        cls,
        choices: Sequence[Tuple[int, ...]],
        tokens: IntList,
        *,
        root: Optional[Union[int, mx.array]] = None,
    ) -> "Tree":
        """Build a tree from Medusa-style paths of child indices.

        ``choices`` lists one path per node, e.g. ``[(0,), (1,), (0, 0), (0, 1)]``:
        ``(0, 1)`` is the second child of the first child of the root. A node's
        parent path must appear earlier in the list.

        Args:
            choices: ``N`` tuples of child indices, parents before children.
            tokens: either ``(N,)`` token ids aligned with ``choices``, or
                ``(D, K)`` per-depth candidates (Medusa heads' top-k), in which
                case path ``c`` gets ``tokens[len(c) - 1, c[-1]]``.
            root: optional token for an explicit root node (e.g. the last
                sampled token, whose K/V is not cached yet). If given it becomes
                node 0 and the choices follow as nodes ``1..N``; otherwise the
                depth-1 choices are roots. Default: ``None``.

        Returns:
            The :class:`Tree`, with ``N`` (or ``N + 1`` with ``root``) nodes.
        """
        choices = [tuple(c) for c in choices]
        index = {}
        parents = []
        for i, path in enumerate(choices):
            if len(path) == 0 or path in index:
                raise ValueError(f"choices[{i}] = {path}: empty or repeated path.")
            if len(path) > 1 and path[:-1] not in index:
                raise ValueError(
                    f"choices[{i}] = {path}: its parent {path[:-1]} must come earlier."
                )
            index[path] = i
            parents.append(index[path[:-1]] if len(path) > 1 else -1)

        tokens = _as_array(tokens)
        if tokens.ndim == 2:
            rows = mx.array([len(c) - 1 for c in choices])
            cols = mx.array([c[-1] for c in choices])
            tokens = tokens[rows, cols]
        if root is not None:
            root = mx.array(root, dtype=tokens.dtype).reshape(1)
            tokens = mx.concatenate([root, tokens])
            parents = [-1] + [p + 1 for p in parents]  # old roots -> child of 0
        return cls.from_parents(tokens, parents)

    def grow(self, tokens: IntList, parents: IntList) -> "Tree":
        """Append ``K`` new nodes whose parents are existing nodes (a draft level).

        Lazy, so ``parents`` can come straight from a device top-k. Forward
        just the new nodes with ``tree_forward(model, cache, grown, start=N)``.

        Args:
            tokens: ``(K,)`` token ids of the new nodes.
            parents: ``(K,)`` parent of each new node, in ``[0, N)``, or ``-1``
                for a new root.

        Returns:
            A :class:`Tree` with ``N + K`` nodes; the first ``N`` are unchanged.
        """
        n = self.size
        if not isinstance(parents, mx.array):
            parents = list(parents)
            if not all(-1 <= p < n for p in parents):
                raise ValueError(f"grow: parents {parents} must be in [-1, {n}).")
        tokens = _as_array(tokens)
        parents = mx.array(parents, dtype=mx.int32)
        k = parents.shape[0]
        if tokens.shape != (k,) or k == 0:
            raise ValueError(
                f"grow: tokens {tuple(tokens.shape)} and parents ({k},) must both "
                "have shape (K,) with K >= 1."
            )
        has_parent = parents >= 0
        safe = mx.maximum(parents, 0)
        rows = self.ancestor_mask[safe] & has_parent[:, None]  # (K, N)
        top = mx.concatenate([self.ancestor_mask, mx.zeros((n, k), mx.bool_)], 1)
        bottom = mx.concatenate([rows, mx.eye(k, dtype=mx.bool_)], 1)
        depth = mx.where(has_parent, self.depth[safe] + 1, 0).astype(mx.int32)
        return Tree(
            mx.concatenate([self.tokens, tokens.astype(self.tokens.dtype)]),
            mx.concatenate([self.parents, parents]),
            mx.concatenate([self.depth, depth]),
            mx.concatenate([top, bottom], 0),
        )

    def subtree(self, nodes: IntList) -> "Tree":
        """Keep only ``nodes`` (e.g. the best-scored draft nodes to verify).

        ``nodes`` must be ascending and closed under ancestors (every kept
        node's parent is kept), as a top-``M`` by cumulative draft probability
        is; only the ascending order is checked, and only for host lists.
        Node ``m`` of the result is node ``nodes[m]`` of this tree, so a path
        ``p`` found in the subtree is ``nodes[p]`` here.

        Args:
            nodes: ``(M,)`` node indices.

        Returns:
            A :class:`Tree` with ``M`` nodes.
        """
        if not isinstance(nodes, mx.array):
            nodes = list(nodes)
            if any(a >= b for a, b in zip(nodes, nodes[1:])):
                raise ValueError(f"subtree: nodes {nodes} must be ascending.")
        nodes = mx.array(nodes, dtype=mx.int32)
        parents = self.parents[nodes]
        # A kept parent's new index is the number of kept nodes before it.
        remapped = (nodes[None, :] < parents[:, None]).sum(axis=1).astype(mx.int32)
        return Tree(
            self.tokens[nodes],
            mx.where(parents >= 0, remapped, -1),
            self.depth[nodes],
            self.ancestor_mask[nodes][:, nodes],
        )

    def path(self, node: Union[int, mx.array], length: int) -> mx.array:
        """Flattened indices of the root-to-``node`` path, root first.

        Lazy: ``node`` may be a device scalar; ``length`` (``depth[node] + 1``)
        must be known on the host, e.g. from the round's single sync.

        Returns:
            ``(length,)`` int32 node indices, ready for :func:`commit_path`.
        """
        row = self.ancestor_mask[node]
        n = self.size
        order = mx.arange(n, dtype=mx.int32)
        # Ancestors have smaller indices than descendants: sort them first, in order.
        keys = mx.where(row, order, order + n)
        return mx.argsort(keys)[:length].astype(mx.int32)


def _as_array(x: IntList) -> mx.array:
    return x if isinstance(x, mx.array) else mx.array(x)


def _host_structure(parents: List[int]) -> Tuple[List[int], List[int], Any]:
    """Host ``(N,)`` parents -> ``(parents, depth, (N, N) bool ancestor mask)``.

    Checks that each parent precedes its child (``-1 <= parents[i] < i``).
    """
    n = len(parents)
    mask = np.zeros((n, n), dtype=np.bool_)
    depth = [0] * n
    for i, p in enumerate(parents):
        if not -1 <= p < i:
            raise ValueError(
                f"parents[{i}] = {p}: must be -1 (root) or a node index < {i}."
            )
        if p >= 0:
            mask[i] = mask[p]
            depth[i] = depth[p] + 1
        mask[i, i] = True
    return parents, depth, mask


def _ancestor_mask(parents: mx.array) -> mx.array:
    """``(N,)`` parents -> ``(N, N)`` bool ancestor-or-self mask, by squaring."""
    n = parents.shape[0]
    nodes = mx.arange(n)
    reach = (parents[:, None] == nodes[None, :]) | (nodes[:, None] == nodes[None, :])
    # After k squarings ``reach`` covers ancestors up to 2**k levels up.
    for _ in range(math.ceil(math.log2(max(n - 1, 1)))):
        f = reach.astype(mx.float32)
        reach = (f @ f) > 0
    return reach


class _TreePositions:
    """Marker passed as ``cache.offset`` in tree mode: per-token rope positions."""

    __slots__ = ("positions",)

    def __init__(self, positions: mx.array):
        self.positions = positions


def rope_positions(positions: mx.array) -> _TreePositions:
    """A ``cache.offset`` that makes a prepared model rotate each token at its own
    position (``positions`` broadcasts to the ``(B, L)`` of the forward)."""
    return _TreePositions(positions.astype(mx.int32))


class TreeRoPE(nn.Module):
    """Wraps an attention layer's rope to accept per-token positions.

    Given a :class:`_TreePositions` offset it rotates ``x`` ``(B, H, L, D)`` as
    ``B * L`` batch rows of one token each, with one offset per row. Any other
    call is forwarded unchanged to the wrapped rope.
    """

    def __init__(self, rope: nn.Module):
        super().__init__()
        self.rope = rope

    def __call__(self, x: mx.array, *args, **kwargs) -> mx.array:
        offset = kwargs.get("offset", args[0] if args else 0)
        if not isinstance(offset, _TreePositions):
            return self.rope(x, *args, **kwargs)
        B, H, L, D = x.shape
        positions = mx.broadcast_to(offset.positions, (B, L)).reshape(-1)
        x = x.transpose(0, 2, 1, 3).reshape(B * L, H, 1, D)
        x = self.rope(x, offset=positions)
        return x.reshape(B, L, H, D).transpose(0, 2, 1, 3)


class _TreeCacheView:
    """A layer cache seen with tree positions and a tree mask; all else delegates."""

    __slots__ = ("_cache", "_positions", "_mask")

    def __init__(self, cache: Any, positions: _TreePositions, mask: mx.array):
        object.__setattr__(self, "_cache", cache)
        object.__setattr__(self, "_positions", positions)
        object.__setattr__(self, "_mask", mask)

    def __getattr__(self, name):
        return getattr(self._cache, name)

    def __setattr__(self, name, value):
        setattr(self._cache, name, value)

    @property
    def offset(self) -> _TreePositions:
        return self._positions

    def make_mask(self, N: int, return_array: bool = False, window_size=None):
        if window_size is not None:
            raise ValueError("Tree attention does not support sliding-window layers.")
        return self._mask


def model_type(model: nn.Module) -> str:
    """The ``model_type`` of an mlx-lm model, as in its ``config.json``."""
    name = getattr(model, "model_type", None)
    if name is None and hasattr(model, "args"):
        name = getattr(model.args, "model_type", None)
    return str(name)


def tree_unsupported(
    model: nn.Module, cache: Optional[List[Any]] = None
) -> Optional[str]:
    """Why tree attention cannot run ``model`` (on ``cache``), or ``None`` if it can.

    Tree attention covers attention layers only: a recurrent layer (linear
    attention, SSM, short convolution) reads one sequence, not a tree, and a
    sliding-window layer would need the window applied per tree path.
    """
    kind = model_type(model)
    if kind not in SUPPORTED_ARCHITECTURES:
        return (
            f"Tree attention does not support the '{kind}' architecture "
            f"(supported: {', '.join(SUPPORTED_ARCHITECTURES)})."
        )
    for layer in model.layers:
        if getattr(layer, "use_sliding", False):
            return f"Tree attention does not support sliding-window layers ({kind})."
        rope = layer.self_attn.rope
        if not isinstance(rope, TreeRoPE) and type(rope) not in _SUPPORTED_ROPES:
            return (
                f"Tree attention does not support {type(rope).__name__} "
                f"(supported ropes: {', '.join(r.__name__ for r in _SUPPORTED_ROPES)})."
            )
    if cache is not None:
        bad = {type(c).__name__ for c in cache if type(c) not in _SUPPORTED_CACHES}
        if bad:
            return (
                f"Tree attention needs KVCache or QuantizedKVCache, got {sorted(bad)}."
            )
    return None


def prepare_tree_model(model: nn.Module) -> nn.Module:
    """Enable tree forwards on an mlx-lm model (idempotent, in place).

    Wraps each attention layer's rope in a :class:`TreeRoPE`. Normal forwards
    are unchanged bit for bit; the model has no extra parameters.

    Args:
        model: an mlx-lm ``Model`` whose ``model_type`` is in
            ``SUPPORTED_ARCHITECTURES``.

    Returns:
        The same model.

    Raises:
        ValueError: for another architecture, a sliding-window layer or a
            rope variant that cannot take per-token positions.
    """
    reason = tree_unsupported(model)
    if reason is not None:
        raise ValueError(reason)
    for layer in model.layers:
        attn = layer.self_attn
        if not isinstance(attn.rope, TreeRoPE):
            attn.rope = TreeRoPE(attn.rope)
    return model


def _check_ready(model: nn.Module, cache: List[Any]) -> int:
    """Validates model and caches; returns the common cache offset."""
    layers = model.layers
    if not layers or not isinstance(layers[0].self_attn.rope, TreeRoPE):
        raise ValueError("Call prepare_tree_model(model) before a tree forward.")
    return _check_caches(cache)


def _check_caches(cache: List[Any]) -> int:
    """Validates the cache types; returns their common offset."""
    bad = {type(c).__name__ for c in cache if type(c) not in _SUPPORTED_CACHES}
    if bad:
        raise ValueError(
            f"Tree attention needs KVCache or QuantizedKVCache, got {sorted(bad)}."
        )
    offsets = {c.offset for c in cache}
    if len(offsets) != 1:
        raise ValueError(f"Layer caches disagree on their offset: {sorted(offsets)}.")
    return offsets.pop()


def masked_forward(
    model: nn.Module,
    cache: List[Any],
    tokens: mx.array,
    positions: mx.array,
    mask: mx.array,
) -> mx.array:
    """One forward of ``N`` new tokens with explicit positions and visibility.

    The general primitive under :func:`tree_forward`: with ``S`` entries already
    in the cache, the new tokens go to slots ``S..S+N-1`` and token ``i``
    attends to slot ``j`` iff ``mask[i, j]``.

    Args:
        model: a model prepared by :func:`prepare_tree_model`; either the
            mlx-lm ``Model`` (returns logits) or its ``.model`` (final hidden
            states).
        cache: the per-layer caches (``KVCache`` or ``QuantizedKVCache``),
            all at offset ``S``. They gain ``N`` entries.
        tokens: ``(N,)`` or ``(B, N)`` token ids.
        positions: ``(N,)`` or ``(B, N)`` absolute rope positions.
        mask: ``(N, S + N)`` or ``(B, N, S + N)`` bool visibility.

    Returns:
        The model output for the new tokens: ``(N, V)`` logits for ``(N,)``
        tokens, ``(B, N, V)`` for ``(B, N)``.
    """
    S = _check_ready(model, cache)
    N = tokens.shape[-1]
    if mask.shape[-2:] != (N, S + N):
        raise ValueError(
            f"mask has shape {tuple(mask.shape)}, expected (..., {N}, {S + N})."
        )
    if mask.ndim == 3:
        mask = mask[:, None]  # (B, 1, N, S+N) broadcasts over heads
    marker = _TreePositions(positions.astype(mx.int32))
    views = [_TreeCacheView(c, marker, mask) for c in cache]
    if tokens.ndim == 1:
        return model(tokens[None], cache=views)[0]
    return model(tokens, cache=views)


def tree_forward(
    model: nn.Module, cache: List[Any], tree: Tree, *, start: int = 0
) -> mx.array:
    """Run the tree's nodes ``start..N-1`` in one forward after the prefix.

    With ``start=0`` (verification) the cache holds just the prefix of length
    ``P``. With ``start > 0`` (expanding a draft tree level by level) it holds
    the prefix followed by nodes ``0..start-1`` in flattened order, e.g. from
    an earlier call. Each node sees the whole prefix, its ancestors and itself,
    and sits at position ``P + depth``. Afterwards the cache holds nodes
    ``0..N-1`` after the prefix; see :func:`commit_path` to keep one path.

    Args:
        model: a model prepared by :func:`prepare_tree_model`.
        cache: the per-layer ``KVCache`` / ``QuantizedKVCache`` list.
        tree: the :class:`Tree` with ``N`` nodes.
        start: number of leading nodes already in the cache. Default: ``0``.

    Returns:
        ``(N - start, V)`` logits; row ``i`` predicts the token after the
        root-to-node ``start + i`` path.
    """
    offset = _check_ready(model, cache)
    prefix_len = offset - start
    if not 0 <= start < tree.size or prefix_len < 0:
        raise ValueError(
            f"start={start} must be in [0, {tree.size}) and at most the cache "
            f"offset {offset}."
        )
    rows = tree.ancestor_mask[start:]
    n = rows.shape[0]
    mask = mx.concatenate([mx.ones((n, prefix_len), dtype=mx.bool_), rows], axis=1)
    positions = prefix_len + tree.depth[start:]
    return masked_forward(model, cache, tree.tokens[start:], positions, mask)


def commit_path(
    cache: List[Any],
    prefix_len: int,
    path: IntList,
    *,
    kv_bits: Optional[int] = None,
    kv_group_size: int = 64,
    quantized_kv_start: int = 0,
) -> None:
    """Keep one root-to-node path of tree entries, contiguous after the prefix.

    Gathers the K/V of nodes ``path`` (flattened indices, root first) into
    slots ``prefix_len..prefix_len+K-1`` and drops the other tree entries
    (cache offset becomes ``prefix_len + K``). Then, with ``kv_bits``, layers
    that reached ``quantized_kv_start`` become ``QuantizedKVCache`` in place,
    as ``mlx_lm.generate`` does after each step. Lazy: no host sync.

    Args:
        cache: the per-layer ``KVCache`` / ``QuantizedKVCache`` list, holding
            the prefix then the tree nodes in flattened order.
        prefix_len: cache length before the tree.
        path: ``(K,)`` node indices (list or device array), root first.
        kv_bits, kv_group_size, quantized_kv_start: KV-cache quantisation, as
            in ``mlx_lm.generate``. Default: none.
    """
    if isinstance(path, mx.array):
        K = path.shape[0]
        identity = False
    else:
        path = list(path)
        K = len(path)
        identity = path == list(range(K))
    offset = _check_caches(cache)
    if offset < prefix_len + K:
        raise ValueError(
            f"Cache offset {offset} is shorter than prefix_len + path "
            f"({prefix_len} + {K})."
        )
    if K > 0 and not identity:
        idx = mx.array(path, dtype=mx.int32) + prefix_len
        end = prefix_len + K
        for c in cache:
            arrays = (c.keys, c.values)
            if isinstance(c, QuantizedKVCache):
                arrays = (*c.keys, *c.values)  # (data, scales, biases) each
            for x in arrays:
                x[..., prefix_len:end, :] = mx.take(x, idx, axis=-2)
    for c in cache:
        c.offset = prefix_len + K
    maybe_quantize_kv_cache(cache, quantized_kv_start, kv_group_size, kv_bits)
