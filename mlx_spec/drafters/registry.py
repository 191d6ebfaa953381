"""Method name -> drafter factory, each imported only when its method runs.

A new drafter is one module in this package and one line in
:data:`FACTORIES`. Only the engine imports this module; no drafter does.

A factory is called as ``factory(config, target, draft_model, cache, kv,
vocab_size)``, where ``cache`` is the part of the caller's ``prompt_cache``
after the target's layers, and returns a drafter (see ``base.Drafter``).
"""

import importlib
from typing import Callable, Dict, Union

# "module:function" strings keep every drafter module out of start-up.
FACTORIES: Dict[str, Union[str, Callable]] = {
    "draft": "mlx_spec.drafters.model:make_model_drafter",
    "tree": "mlx_spec.drafters.tree:make_tree_drafter",
    "lookup": "mlx_spec.drafters.lookup:make_lookup_drafter",
    "self": "mlx_spec.drafters.self_spec:make_self_drafter",
    "auto": "mlx_spec.drafters.auto:make_auto_drafter",
    "eagle": "mlx_spec.drafters.eagle:make_eagle_drafter",
    "eagle-chain": "mlx_spec.drafters.eagle:make_eagle_chain_drafter",
    "medusa": "mlx_spec.drafters.medusa:make_medusa_drafter",
    "mtp": "mlx_spec.drafters.mtp:make_mtp_drafter",
    "dflash": "mlx_spec.drafters.published.dflash:make_dflash_drafter",
}

# "none" is plain mlx_lm decoding, which needs no drafter.
METHODS = ("none", *FACTORIES)


def factory_of(method: str) -> Callable:
    """The factory of ``method``, importing its module on first use."""
    entry = FACTORIES[method]
    if callable(entry):
        return entry
    module, function = entry.split(":")
    return getattr(importlib.import_module(module), function)


def make_drafter(config, target, draft_model, cache, kv, vocab_size: int):
    """Build the drafter of ``config.method``."""
    if config.method == "none":
        raise ValueError(
            "method 'none' is plain decoding, which speculative_generate_step does "
            "not run; use mlx_spec.stream_generate or mlx_lm's generate_step."
        )
    if config.method not in FACTORIES:
        available = ", ".join(METHODS)
        raise ValueError(
            f"speculative method '{config.method}' is not available; use one of: {available}."
        )
    return factory_of(config.method)(config, target, draft_model, cache, kv, vocab_size)
