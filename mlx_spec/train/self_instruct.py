"""Requests written by the target itself, for training data without a dataset.

A chat model that is given its chat template up to the start of a user turn,
and nothing else, writes a user request from its own learned law of requests
(the Magpie recipe). Sampling that turn many times gives prompts as varied as
the model's own instruction data, with no dataset and no handwritten
templates. The draft then learns the target on the kind of request the
target was tuned for, not only on the built-in templates.

Typical use::

    from mlx_spec.train.self_instruct import self_instruct_prompts
    train, heldout = self_instruct_prompts(model, tokenizer, 512, "data/self.jsonl")
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, List, Optional, Sequence, Tuple

import mlx.core as mx

from .lanes import LaneDecoder
from .prompt import Prompt, split_of

PROMPT_SET = "self"
DEFAULT_TEMP = 1.0
DEFAULT_TOP_P = 0.95
# Longest request; a request still unfinished there is dropped.
DEFAULT_MAX_TOKENS = 96
MIN_CHARS = 16
# Requests sampled per batch (decoded together in one lane).
DEFAULT_BATCH_SIZE = 64
# Give up after this many batches in a row add no new request.
MAX_BARREN_BATCHES = 3


def user_turn_prefix(tokenizer) -> List[int]:
    """Token ids of the chat template up to where a user's words begin.

    Raises:
        ValueError: The tokenizer has no chat template.
    """
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            "--self-instruct needs a chat model: the target's tokenizer has no chat "
            "template; pass --prompts FILE instead."
        )
    marker = "\u2063MLX-SPEC-REQUEST\u2063"
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": marker}], tokenize=False
    )
    if marker not in text:
        raise ValueError("the target's chat template drops the user's words.")
    prefix = text[: text.index(marker)]
    return list(tokenizer.encode(prefix, add_special_tokens=False))


def clean_request(text: str) -> Optional[str]:
    """The request's text, or None if it is too short to be a request."""
    text = text.strip()
    return text if len(text) >= MIN_CHARS else None


def sample_requests(
    model,
    tokenizer,
    count: int,
    *,
    seen: Sequence[str] = (),
    temp: float = DEFAULT_TEMP,
    top_p: float = DEFAULT_TOP_P,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    batch_size: int = DEFAULT_BATCH_SIZE,
    progress: Optional[Callable[[int], None]] = None,
) -> List[str]:
    """``count`` new distinct requests sampled from the target (fewer if it repeats itself).

    Each token is drawn at ``temp`` from the ``top_p`` nucleus of the
    target's law (mlx-lm's ``make_sampler(temp, top_p)``; see
    :func:`~mlx_spec.train.lanes.sample_rows`). Only requests that the target
    ends itself (with an end-of-turn token within ``max_tokens``) are kept;
    ``seen`` are not repeated.
    """
    prefix = user_turn_prefix(tokenizer)
    stops = set(int(t) for t in tokenizer.eos_token_ids)
    known = {s.lower() for s in seen}
    found: List[str] = []
    barren = 0
    while len(found) < count and barren < MAX_BARREN_BATCHES:
        gen = LaneDecoder(model, batch_size, stops)
        try:
            uids = [
                gen.insert(prefix, max_tokens, temp, top_p) for _ in range(batch_size)
            ]
            tokens = {u: [] for u in uids}
            ended = set()
            while responses := gen.next_generated():
                for r in responses:
                    if r.finish_reason == "stop":
                        ended.add(r.uid)
                    else:
                        tokens[r.uid].append(r.token)
        finally:
            gen.close()
        before = len(found)
        for u in uids:
            text = clean_request(tokenizer.decode(tokens[u])) if u in ended else None
            if text is not None and text.lower() not in known:
                known.add(text.lower())
                found.append(text)
        barren = 0 if len(found) > before else barren + 1
        if progress is not None:
            progress(min(len(found), count) - min(before, count))
    return found[:count]


def _request_prompt(text: str, number: int) -> Prompt:
    return Prompt(PROMPT_SET, ({"role": "user", "content": text},), f"self:{number}")


def self_instruct_prompts(
    model,
    tokenizer,
    count: int,
    path,
    *,
    seed: int = 0,
    progress: bool = True,
    log: Optional[Callable[[str], None]] = None,
    **sampling,
) -> Tuple[List[Prompt], List[Prompt]]:
    """``count`` target-written requests, split into training and held-out prompts.

    The requests are kept in ``path`` (JSON lines, the ``--prompts`` format),
    so a resumed run reuses them and only samples the ones still missing.
    A request is held out by a hash of its text (one in
    :data:`~mlx_spec.train.prompts.HELDOUT_EVERY`).

    Args:
        model, tokenizer: The target.
        count: Requests wanted in all (both splits).
        path: The JSON-lines file of the requests.
        seed: Seed of the sampling.
        progress: Show a progress bar (tqdm).
        log: Called with one summary line.
        sampling: Passed to :func:`sample_requests`.

    Returns:
        ``(training prompts, held-out prompts)``.
    """
    path = Path(path)
    texts: List[str] = []
    if path.exists():
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                texts.append(json.loads(line)["messages"][-1]["content"])
    missing = count - len(texts)
    if missing > 0:
        bar = None
        if progress:
            from tqdm import tqdm

            bar = tqdm(total=count, initial=len(texts), desc="requests", unit="req")
        mx.random.seed(seed + len(texts))
        new = sample_requests(
            model,
            tokenizer,
            missing,
            seen=texts,
            progress=bar.update if bar is not None else None,
            **sampling,
        )
        if bar is not None:
            bar.close()
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a", encoding="utf-8") as f:
            for text in new:
                row = {"prompt_set": PROMPT_SET, "messages": [_message(text)]}
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
        texts += new
    prompts = [_request_prompt(t, i) for i, t in enumerate(texts[:count])]
    train = [p for p in prompts if split_of(p.text) == "train"]
    heldout = [p for p in prompts if split_of(p.text) == "heldout"]
    if log is not None:
        log(
            f"self-instruct: {len(prompts)} requests written by the target "
            f"({len(train)} train, {len(heldout)} held out) in {path.name}"
        )
    return train, heldout


def _message(text: str) -> dict:
    return {"role": "user", "content": text}
