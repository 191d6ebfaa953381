"""Which generation writes into a prompt cache, so a suspended one cannot
leave it silently different.

A caller that breaks out of ``stream_generate`` and keeps the stream leaves
it suspended mid-round: its caches may hold draft tokens not yet rewound, or
miss the last emitted token, until the generator is closed. A later call on
the same caches first closes that generation (:func:`claim`), which rewinds
them to the prompt and the tokens it yielded, exactly as ``close()`` would:
the state plain mlx-lm leaves after the same break. A generation still
running elsewhere (another thread) cannot be closed: the call is refused in
one line naming ``close()``. Caches a cancelled prefill left half-filled and
could not rewind are marked (:func:`spoil`) and refused too.
"""

import threading
import weakref
from typing import Any, List, Optional

from .capture import leaf_caches

# id(leaf cache) -> the stream generating into it (dropped with the stream).
_owners: "weakref.WeakValueDictionary[int, Any]" = weakref.WeakValueDictionary()
# id(stream) -> the thread that made it.
_threads: "dict[int, int]" = {}
# id(leaf cache) -> the cache itself, for caches left half-filled.
_spoiled: "weakref.WeakValueDictionary[int, Any]" = weakref.WeakValueDictionary()

BUSY = (
    "prompt_cache is in use by a generation that is still running or was left "
    "open in another thread; call close() on that generation (in its thread), "
    "or let it finish, before reusing its prompt_cache."
)
SPOILED = (
    "prompt_cache was left part-way through a prompt by a cancelled generation "
    "and cannot be rewound; make a new one with make_prompt_cache."
)


def claim(prompt_cache: Optional[List[Any]]) -> None:
    """Close any earlier generation still holding ``prompt_cache``'s caches.

    Raises:
        ValueError: That generation is running now, or the cache is spoilt.
    """
    if not prompt_cache:
        return
    if spoiled(prompt_cache):
        raise ValueError(SPOILED)
    leaves = leaf_caches(prompt_cache)
    earlier = {}
    for c in leaves:
        owner = _owners.get(id(c))
        if owner is not None:
            earlier[id(owner)] = owner, _threads.get(id(owner))
    here = threading.get_ident()
    for owner, thread in earlier.values():
        if thread != here:  # MLX streams cannot leave the thread they began in
            raise ValueError(BUSY)
        try:
            owner.close()  # rewinds the caches in its finally
        except ValueError:  # "generator already executing"
            raise ValueError(BUSY) from None


def own(prompt_cache: Optional[List[Any]], owner: Any) -> None:
    """Record ``owner`` (with a ``close()``) as the generation writing ``prompt_cache``."""
    leaves = leaf_caches(prompt_cache or [])
    if not leaves:
        return
    _threads[id(owner)] = threading.get_ident()
    weakref.finalize(owner, _threads.pop, id(owner), None)
    for c in leaves:
        _owners[id(c)] = owner


def spoiled(prompt_cache: Optional[List[Any]]) -> bool:
    """Whether a cancelled prefill left ``prompt_cache`` part-filled (:func:`spoil`)."""
    return any(_spoiled.get(id(c)) is c for c in leaf_caches(prompt_cache or []))


def spoil(prompt_cache: Optional[List[Any]]) -> None:
    """Mark ``prompt_cache`` as holding part of a prompt it cannot rewind."""
    for c in leaf_caches(prompt_cache or []):
        _spoiled[id(c)] = c
