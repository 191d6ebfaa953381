"""The app's engine side: loaded models and per-browser conversations.

Every model load and generation runs on the app's one MLX thread
(:class:`ui.worker.Worker`). Stopping sets a session's event that drops a
waiting request, and that the generation checks between prefill slices
and before every token; the ``SpecStream`` then leaves the caches holding
the prompt and the tokens yielded (or, stopped in the prompt, what they
held). A chat turn's prompt is read in slices of bounded time
(:mod:`ui.prefill`), so Stop and other users' requests get the model soon
on any machine.

A chat turn (:func:`respond`) runs the tokenizer's chat template over the
whole conversation (system prompt first) and reuses the session's prompt
cache for the longest common prefix, so only the new tokens are prefilled
and the reply is exactly what plain decoding of the full conversation gives.
Everything here runs without a browser.
"""

import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

from mlx_lm.models.cache import (
    can_trim_prompt_cache,
    make_prompt_cache,
    trim_prompt_cache,
)

from mlx_spec.chat_text import encode_chat, repair_text
from mlx_spec.config import SpecConfig, plan_method
from mlx_spec.drafters.fit import drafter_kind
from mlx_spec.generate import stream_generate
from mlx_spec.generation import history_kwargs
from mlx_spec.home import model_folders
from mlx_spec.limits import GenerationCancelled, check_context, stopping_progress
from mlx_spec.loading import (
    default_model_pair,
    draft_source,
    drafter_description,
    drafter_dir_kind,
    drafter_methods,
    load_model,
    resolve_draft,
)
from mlx_spec.models import num_caches

from .prefill import DEFAULT_CAP, prefill_in_slices
from .render import Piece, Turn
from .worker import Prefill, Waiting, Worker

log = logging.getLogger("mlx_spec.ui")

NO_DRAFT = "(none)"
# Characters that show nothing but are not whitespace to str.strip.
_INVISIBLE = dict.fromkeys(map(ord, "\u200b\u200c\u200d\u2060\ufeff\u00ad"))
MAX_SESSIONS = 16
MAX_LOADED_MODELS = 4


@dataclass
class Pair:
    """A loaded target and the drafter a method runs with (a model, a head or none)."""

    target_path: str
    draft_path: Optional[str]
    model: Any
    tokenizer: Any
    draft_model: Optional[Any]

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.tokenizer, "has_chat_template", False))

    @property
    def mtp_path(self) -> Optional[str]:
        """Where the drafter was read, when it is a checkpoint's MTP layer."""
        is_mtp = getattr(self.draft_model, "kind", None) == "mtp"
        return getattr(self.draft_model, "path", None) if is_mtp else None

    @property
    def draft_key(self) -> tuple:
        """What drafts: the draft path, or where the MTP layer came from."""
        return (self.draft_path, self.mtp_path)


class ModelStore:
    """Loaded targets and their drafters (a few). Call ``get`` on the worker only.

    Entries are least-recently-used: ``("model", target)`` holds ``(model,
    tokenizer)``; ``("draft", target, ...)`` holds what ``resolve_draft``
    gave for it. Drafters are bound to their target's model object, so they
    leave the store with it.
    """

    def __init__(self, max_models: int = MAX_LOADED_MODELS):
        self._models: "OrderedDict[tuple, Any]" = OrderedDict()
        self._max = max_models

    def loaded(
        self, path: Optional[str], draft: Optional[str] = None, method=None
    ) -> bool:
        """Whether ``get(path, draft, method)`` would load nothing."""
        path, draft = _clean_path(path), _clean_path(draft)
        if path is None:
            return True
        if ("model", path) not in self._models:
            return False
        key = self._draft_key(path, draft, method)
        return key is None or key in self._models

    def _load(self, path: str, role: str):
        key = ("model", path)
        if key not in self._models:
            _refuse_head_as_target(path)
            self._put(key, load_model(path, role))
        self._models.move_to_end(key)
        return self._models[key]

    def _put(self, key: tuple, value):
        """Store ``value``; beyond the cap, drop the least recently used entries."""
        self._models[key] = value
        while sum(v is not None for v in self._models.values()) > self._max:
            self._drop(next(k for k, v in self._models.items() if v is not None))

    def _drop(self, key: tuple):
        """Forget an entry; a target takes its drafters (bound to its model) along."""
        bound = [k for k in self._models if k[1] == key[1]] if key[0] == "model" else []
        for k in bound or [key]:
            del self._models[k]

    def _draft_key(self, target: str, draft: Optional[str], method) -> Optional[tuple]:
        """The entry of the drafter ``method`` runs with, or ``None`` if it needs none.

        Named by :func:`~mlx_spec.loading.draft_source`, so ``auto`` and
        ``mtp`` share one entry for a checkpoint's own MTP layer. Needs the
        target loaded.
        """
        model, _ = self._models[("model", target)]
        source = draft_source(method, target, draft, model)
        return None if source is None else ("draft", target) + source

    def _drafter(self, target: str, draft: Optional[str], method, model, tokenizer):
        """What ``method`` drafts with, read once per target by ``resolve_draft``."""
        key = self._draft_key(target, draft, method)
        if key is None:
            return None
        if key not in self._models:
            self._put(key, resolve_draft(method, target, draft, model, tokenizer))
        self._models.move_to_end(key)
        return self._models[key]

    def get(
        self, target_path: str, draft_path: Optional[str], method: Optional[str] = None
    ) -> Pair:
        """The target and the drafter ``method`` runs with, resolved as the CLI does.

        Raises:
            ValueError: One line, for a bad path, a draft the target refuses, or
              ``mtp`` on a checkpoint without an MTP layer.
        """
        target_path = _clean_path(target_path)
        draft_path = _clean_path(draft_path)
        if not target_path:
            raise ValueError(
                "choose a target model (a local path or a Hugging Face repo)."
            )
        model, tokenizer = self._load(target_path, "model")
        draft_model = self._drafter(target_path, draft_path, method, model, tokenizer)
        return Pair(target_path, draft_path, model, tokenizer, draft_model)


def _refuse_head_as_target(path: str):
    """A one-line ``ValueError`` when a trained head is chosen as the target."""
    kind = drafter_dir_kind(path)
    if kind is not None:  # named by its folder: the advice fits the error banner
        raise ValueError(
            f"'{Path(path).name}' is {drafter_description(kind)} (a drafter), not a "
            f"target model: choose it as the draft model and pick the "
            f"{drafter_methods(kind)} method."
        )


def _clean_path(path: Optional[str]) -> Optional[str]:
    if path is None:
        return None
    path = str(path).strip()
    return None if not path or path == NO_DRAFT else path


def generation_kwargs(config: SpecConfig) -> Dict[str, Any]:
    """``stream_generate``'s keyword arguments for the settings in ``config``."""
    kwargs = {f.name: getattr(config, f.name) for f in fields(config)}
    kwargs["speculative"] = kwargs.pop("method")
    return kwargs


@dataclass
class Timing:
    """Wall-clock times of one generation, taken the same way for every method."""

    start: float = 0.0
    first: Optional[float] = None  # when the first token arrived
    last: Optional[float] = None  # when the last token arrived
    tokens: int = 0

    @property
    def decode_tps(self) -> float:
        """Tokens per second after the first token (the prompt excluded)."""
        if self.tokens < 2 or self.last is None or self.last <= self.first:
            return 0.0
        return (self.tokens - 1) / (self.last - self.first)

    @property
    def total(self) -> float:
        """Seconds from the request to the last token (the prompt included)."""
        return (self.last - self.start) if self.last is not None else 0.0


@dataclass
class Session:
    """One browser session: its conversation, prompt cache and stop flag.

    ``cache_tokens`` are the token ids the prompt cache holds; a new turn
    reuses their longest common prefix with its prompt and trims the rest.
    """

    turns: List[Turn] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    cache: Optional[List[Any]] = None
    cache_key: Optional[tuple] = None
    cache_tokens: List[int] = field(default_factory=list)
    last_reused: int = 0
    timing: Timing = field(default_factory=Timing)
    pair_key: Optional[tuple] = None  # (target, draft, chat) of the turns
    epoch: int = 0  # counts resets, so a reply can tell its chat was cleared
    # The page counts its Stop presses: the count heard, and the count when
    # the page sent the request now starting (see begin_turn).
    stops_heard: int = 0
    stops_at_send: Optional[int] = None  # None: not counted (an API caller)
    _busy: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _stopping: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def reset(self):
        self.turns = []
        self.epoch += 1
        self.drop_cache()

    def press_stop(self, count: int = 0):
        """Stop the request running or waiting; ``count`` is the page's count
        of its Stop presses, this one included."""
        with self._stopping:
            self.stops_heard = max(self.stops_heard, count)
            self.stop.set()

    def begin_turn(self):
        """Clear Stop for the request starting, unless the page pressed Stop
        after sending it (its Stop may be handled first)."""
        with self._stopping:
            sent = self.stops_at_send
            if sent is None or self.stops_heard <= sent:
                self.stop.clear()

    def claim(self) -> bool:
        """Take the session for one request; ``False`` if one is running.

        The one guard against a second turn from one send (a click and a key
        at once, repeated script clicks): each request claims, then releases.
        """
        return self._busy.acquire(blocking=False)

    def release(self):
        self._busy.release()

    @property
    def busy(self) -> bool:
        return self._busy.locked()

    def drop_cache(self):
        self.cache, self.cache_key, self.cache_tokens = None, None, []


class Sessions:
    """Sessions by Gradio session hash; the oldest are dropped beyond a cap."""

    def __init__(self, capacity: int = MAX_SESSIONS):
        self._sessions: "OrderedDict[str, Session]" = OrderedDict()
        self._capacity = capacity
        self._lock = threading.Lock()

    def get(self, key: Optional[str]) -> Session:
        key = key or "default"
        with self._lock:
            if key not in self._sessions:
                self._sessions[key] = Session()
            self._sessions.move_to_end(key)
            while len(self._sessions) > self._capacity:
                self._sessions.popitem(last=False)
            return self._sessions[key]

    def drop(self, key: Optional[str]):
        with self._lock:
            self._sessions.pop(key or "default", None)


def cache_layout(method: str, pair: Pair) -> Tuple[str, bool]:
    """The prompt cache a method uses and whether it runs the draft model.

    Returns ``("pair", True)`` for target + draft caches (the draft model
    drafts) and ``("target", False)`` for the target's caches only.
    """
    _, uses_draft = plan_method(method, pair.draft_model)
    return ("pair", True) if uses_draft else ("target", False)


def _new_cache(layout: str, pair: Pair) -> List[Any]:
    cache = make_prompt_cache(pair.model)
    if layout == "pair":
        cache += make_prompt_cache(pair.draft_model)
    return cache


def _offsets(cache: List[Any]) -> set:
    return {int(c.offset) for c in cache if hasattr(c, "offset")}


def common_prefix(a: List[int], b: List[int]) -> int:
    """Length of the longest common prefix of two token lists."""
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


def chat_messages(
    history: List[Turn], text: str, system: Optional[str] = None
) -> List[Dict[str, str]]:
    """The conversation as chat-template messages: system, earlier turns, ``text``.

    An empty ``system`` leaves the system message out (the template's own
    default applies, if it has one).
    """
    messages = []
    if system and system.strip():
        messages.append({"role": "system", "content": system})
    for turn in history:
        messages.append({"role": "user", "content": turn.user})
        messages.append({"role": "assistant", "content": turn.reply})
    messages.append({"role": "user", "content": text})
    return messages


def encode_prompt(
    tokenizer,
    text: str,
    history: List[Turn],
    chat: bool,
    system: Optional[str] = None,
) -> List[int]:
    """Token ids of the full prompt: the chat template over the conversation, or raw text.

    In chat mode the template runs with ``add_generation_prompt=True`` over
    :func:`chat_messages`, the messages' text kept literal (see
    :func:`mlx_spec.chat_text.encode_chat`); otherwise ``text`` is encoded as it is (with the
    BOS token unless it already starts with it) and ``history`` is ignored.
    """
    if chat:
        messages = chat_messages(history, text, system)
        return encode_chat(tokenizer, messages, add_generation_prompt=True)
    text = repair_text(text)
    bos = getattr(tokenizer, "bos_token", None)
    add_special = bos is None or not text.startswith(bos)
    return list(tokenizer.encode(text, add_special_tokens=add_special))


def _piece(response, tokenizer) -> Piece:
    rejected = tokenizer.decode(response.rejected) if response.rejected else ""
    return Piece(response.text, response.kind, response.round, rejected)


def run_turn(
    session: Session,
    pair: Pair,
    tokens: List[int],
    options: SpecConfig,
    use_cache: bool = True,
    progress: Optional[Callable[[int, int], None]] = None,
    prefill_step_size: Optional[int] = None,
) -> Iterator[Tuple[Piece, Any]]:
    """Generate on the worker, yielding ``(Piece, response)`` per token.

    With ``use_cache`` the session's prompt cache is reused: only the tokens
    after the longest common prefix with the cached ones are prefilled.
    Those are read in slices of bounded time (:mod:`ui.prefill`) when the
    drafter keeps no cache of its own and reads nothing of the target's.
    ``progress(done, total)`` is called between slices (or the engine's
    chunks), and ``session.stop`` is checked there and before each token
    (see ``should_stop`` of :func:`mlx_spec.stream_generate`);
    ``prefill_step_size`` caps the slice (default: the engine's chunk).
    Closing the generator closes the stream (which rewinds the caches) and
    records what the cache now holds.
    """
    check_not_empty(tokens, "prompt")
    cap = prefill_step_size or DEFAULT_CAP
    layout, uses_draft = cache_layout(options.method, pair)
    draft = pair.draft_model if uses_draft else None
    layout = layout if use_cache else None
    cache, feed, reused = None, tokens, 0
    if layout is not None:
        key = (pair.target_path, pair.draft_key, layout)
        if session.cache is None or session.cache_key != key:
            session.cache, session.cache_key, session.cache_tokens = (
                _new_cache(layout, pair),
                key,
                [],
            )
        cache = session.cache
        reused = min(common_prefix(session.cache_tokens, tokens), len(tokens) - 1)
        extra = len(session.cache_tokens) - reused
        if extra and not can_trim_prompt_cache(cache):
            session.cache, reused = _new_cache(layout, pair), 0
            cache = session.cache
        elif extra:
            trim_prompt_cache(cache, extra)
        session.cache_tokens = tokens[:reused]
        feed = tokens[reused:]
    session.last_reused = reused
    clock = session.timing = Timing(start=time.perf_counter())
    generated: List[int] = []
    stream = None
    try:
        sliced = _prefill_slices(session, pair, draft, cache, feed, progress, cap)
        reused, feed = reused + sliced, feed[sliced:]
        # Prompt lookup also matches the earlier turns the cache holds.
        history = history_kwargs(stream_generate, tokens[:reused])
        stream = stream_generate(
            pair.model,
            pair.tokenizer,
            feed,
            draft_model=draft,
            prompt_cache=cache,
            prompt_progress_callback=_shifted(progress, sliced),
            should_stop=session.stop.is_set,
            **({"prefill_step_size": prefill_step_size} if prefill_step_size else {}),
            **history,
            **generation_kwargs(options),
        )
        for response in stream:
            clock.last = time.perf_counter()
            clock.first = clock.first or clock.last
            clock.tokens += 1
            generated.append(response.token)
            if response.stats is not None:  # the sliced part counts too
                response.stats.prompt_tokens = len(tokens) - session.last_reused
            yield _piece(response, pair.tokenizer), response
    finally:
        if stream is not None:
            stream.close()
        if cache is not None:
            _record_cache(session, cache, tokens + generated)


def _prefill_slices(session, pair, draft, cache, feed, progress, cap) -> int:
    """Read all of ``feed`` but its last token into ``cache`` in bounded-time
    slices (see :mod:`ui.prefill`); how many tokens it read.

    Only when the cache is the target's (and the draft model's) alone and the
    drafter does not tap the target's layers; else the engine reads it all.
    """
    models = [pair.model] + ([draft] if draft is not None else [])
    own = sum(num_caches(m) for m in models)
    taps = drafter_kind(pair.draft_model) not in (None, "draft")
    if cache is None or taps or len(cache) != own or len(feed) < 2:
        return 0
    prefill_in_slices(
        models,
        cache,
        feed[:-1],
        cap,
        stopping_progress(session.stop.is_set, _shifted(progress, 0, 1)),
    )
    return len(feed) - 1


def _shifted(progress, done: int, more: int = 0):
    """``progress`` told of ``done`` tokens read before and ``more`` still to read."""
    if progress is None:
        return None
    return lambda d, t: progress(done + d, done + t + more)


def respond(
    worker: Worker,
    session: Session,
    pair: Pair,
    text: str,
    options: SpecConfig,
    *,
    chat: bool,
    system: Optional[str] = None,
    use_cache: bool = True,
    lend: bool = False,
    prefill_step_size: Optional[int] = None,
) -> Iterator[Turn]:
    """Run one turn on the worker, yielding its :class:`Turn` as it goes.

    In chat mode the message joins ``session.turns`` and the prompt is the
    chat template over the whole conversation; in completion mode it replaces
    them. The turn is yielded once it is in ``session.turns``, then with its
    ``progress`` (:class:`Waiting`, :class:`Prefill`) until tokens arrive,
    then as tokens arrive. It ends with ``finish`` set to ``"stop"`` (end of
    text), ``"length"`` (max tokens) or ``"stopped"`` (``session.stop`` was
    set, while waiting, during the prefill or later, or this generator was
    closed early). The prompt cache then holds exactly the prompt and the
    generated tokens, so the next turn continues exactly.

    Args:
        worker: The MLX thread.
        session: The conversation; its ``stop`` event ends the turn early.
        pair: The loaded models.
        text: The user's message (or the completion prompt), as it is shown
          and sent: see :func:`clean_message`.
        options: Generation settings.
        chat: Use the chat template (the tokenizer must have one).
        system: System prompt of the conversation (chat mode only).
        use_cache: Reuse (and update) the session's prompt cache.
        lend: Let waiting requests run between prompt slices and tokens
          (see :class:`Worker`).
        prefill_step_size: The largest prompt slice (Stop is checked between
          slices). Default: the engine's prefill chunk.

    Raises:
        ValueError: For an empty message, or a conversation that with
          ``max_tokens`` exceeds the model's context, before the turn joins
          the conversation (nothing was prefilled). A turn that fails later stays in it with ``finish``
          ``"error"`` and its ``error`` (left out of later prompts).
    """
    check_not_empty(clean_message(text, trim=False), "message")
    history = [t for t in session.turns if t.finish != "error"] if chat else []
    tokens = encode_prompt(pair.tokenizer, text, history, chat, system)
    check_context(pair.model, len(tokens), options.max_tokens)
    turn = Turn(user=text)
    session.begin_turn()
    session.turns = session.turns + [turn] if chat else [turn]
    batches = worker.stream(
        lambda progress: run_turn(
            session, pair, tokens, options, use_cache, progress, prefill_step_size
        ),
        session.stop,
        lend=lend,
    )
    last = None
    try:
        yield turn
        for batch in batches:
            for item in batch:
                if isinstance(item, (Waiting, Prefill)):
                    turn.progress = item
                else:
                    piece, last = item
                    turn.pieces.append(piece)
                    turn.progress = None
            turn.stats = last.stats if last is not None else None
            yield turn
        turn.finish = last.finish_reason if last and last.finish_reason else "stopped"
    except GenerationCancelled:
        turn.finish = "stopped"
    except Exception as e:
        turn.finish, turn.error = "error", e
        raise
    finally:
        batches.close()
        turn.progress = None
        if turn.finish is None:
            turn.finish = "stopped"


def check_not_empty(value, what: str) -> None:
    """A one-line ``ValueError`` for an empty ``what`` (a message or a prompt)."""
    if not value:
        raise ValueError(f"the {what} is empty; type some text first.")


def clean_message(text: Optional[str], trim: bool = True) -> str:
    """The message as it is sent: invalid Unicode repaired and (with ``trim``)
    trailing whitespace cut.

    Empty when it holds only whitespace of any kind, zero-width and
    non-breaking spaces included.
    """
    text = repair_text(text or "")
    text = text.rstrip() if trim else text
    return text if text.translate(_INVISIBLE).strip() else ""


def _record_cache(session: Session, cache: List[Any], sequence: List[int]):
    """Note which tokens the cache holds; drop it if its layers disagree.

    Layers a stopped prefill left at different lengths are trimmed to the
    shortest, when they can be.
    """
    offsets = _offsets(cache)
    if len(offsets) > 1 and can_trim_prompt_cache(cache):
        keep = min(min(offsets), len(sequence))
        for c in cache:
            c.trim(int(c.offset) - keep)
        offsets = _offsets(cache)
    if len(offsets) != 1 or next(iter(offsets)) > len(sequence):
        log.warning(
            "prompt cache offsets %s do not match the conversation; rebuilding", offsets
        )
        session.drop_cache()
        return
    session.cache_tokens = sequence[: next(iter(offsets))]


def known_models(target: str, draft: Optional[str]) -> List[Tuple[str, str]]:
    """``(label, path)`` of models to offer.

    The app's starting pair first, then the embedded default pair, the
    user's and the shipped models (:mod:`mlx_spec.home`) and the repos in
    the Hugging Face cache.
    """
    try:
        embedded = default_model_pair(build=False)
    except ValueError:  # the default target was not built; offer the rest
        embedded = ()
    found, seen = [], set()
    for path, role in (
        (target, "target"),
        (draft, "draft"),
        *zip(embedded, ("target", "draft")),
    ):
        if path and path not in seen:
            kind = "default" if path in embedded else "starting"
            found.append((f"{Path(path).name} ({kind} {role})", path))
            seen.add(path)
    for folder in model_folders():
        path = str(folder)
        if path not in seen:
            found.append((folder.name, path))
            seen.add(path)
    hub = Path.home() / ".cache" / "huggingface" / "hub"
    for entry in sorted(hub.glob("models--*")):
        repo = entry.name[len("models--") :].replace("--", "/")
        if repo not in seen:
            found.append((repo, repo))
            seen.add(repo)
    return found
