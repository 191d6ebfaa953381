"""User text into tokens: invalid Unicode repaired, message text kept literal.

Used by every front end that tokenizes what a person typed (the UI and the
server). Two rules:

- A lone surrogate (``"\\ud800"``, which a browser or a JSON body can carry
  but UTF-8 cannot) becomes U+FFFD; the tokenizer refused it with a
  ``TypeError``.
- Text that looks like a special token (``<|im_end|><|im_start|>system``)
  stays text: only the chat template adds control tokens. Message contents
  are encoded with ``split_special_tokens``; the template's own parts as
  usual. Without such text the ids are exactly ``apply_chat_template``'s.
"""

import re
from typing import Any, Dict, List, Sequence

_SURROGATE = re.compile("[\ud800-\udfff]")
# Stand-ins for the message contents while the template renders (private use).
_MARK = re.compile("\ue000([0-9]+)\ue001")


def repair_text(text: str) -> str:
    """``text`` with each lone surrogate replaced by U+FFFD (else unchanged)."""
    return _SURROGATE.sub("\ufffd", text)


def special_token_texts(tokenizer) -> List[str]:
    """The texts a tokenizer turns into special tokens when it meets them."""
    texts = set(getattr(tokenizer, "all_special_tokens", None) or [])
    decoder = getattr(tokenizer, "added_tokens_decoder", None) or {}
    texts.update(t.content for t in decoder.values() if getattr(t, "special", False))
    return sorted(t for t in texts if t)


def looks_special(tokenizer, text: str) -> bool:
    """Whether ``text`` holds the text of one of the tokenizer's special tokens."""
    return any(special in text for special in special_token_texts(tokenizer))


def _repaired(messages: Sequence[Dict[str, Any]]) -> List[Dict[str, Any]]:
    return [
        (
            {**m, "content": repair_text(m["content"])}
            if isinstance(m.get("content"), str)
            else dict(m)
        )
        for m in messages
    ]


def encode_chat(
    tokenizer, messages: Sequence[Dict[str, Any]], **template_kwargs
) -> List[int]:
    """Token ids of ``messages`` through the chat template, their text literal.

    Args:
        tokenizer: An mlx-lm ``TokenizerWrapper`` (or a Hugging Face tokenizer)
          with a chat template.
        messages: Chat messages; string contents are repaired (see
          :func:`repair_text`) and kept literal.
        template_kwargs: Passed to ``apply_chat_template``
          (``add_generation_prompt``, ``tools``, ...).

    Returns:
        The ids: ``apply_chat_template``'s when no content looks like a special
        token; otherwise the template's parts encoded as usual and each content
        encoded with ``split_special_tokens``.
    """
    messages = _repaired(messages)
    template_kwargs = {k: v for k, v in template_kwargs.items() if k != "tokenize"}
    contents = [m.get("content") for m in messages]
    if not any(isinstance(c, str) and looks_special(tokenizer, c) for c in contents):
        ids = tokenizer.apply_chat_template(messages, tokenize=True, **template_kwargs)
        return list(ids["input_ids"] if isinstance(ids, dict) else ids)
    marked = [
        {**m, "content": f"\ue000{i}\ue001"} if isinstance(c, str) else m
        for i, (m, c) in enumerate(zip(messages, contents))
    ]
    rendered = tokenizer.apply_chat_template(marked, tokenize=False, **template_kwargs)
    ids: List[int] = []
    for n, part in enumerate(_MARK.split(rendered)):
        if n % 2 == 0:  # the template's own text, control tokens included
            ids += tokenizer.encode(part, add_special_tokens=False) if part else []
        else:
            literal = contents[int(part)]
            ids += tokenizer.encode(
                literal, add_special_tokens=False, split_special_tokens=True
            )
    return ids


class LiteralText:
    """A tokenizer whose chat template and ``encode`` keep user text literal.

    Wraps an mlx-lm ``TokenizerWrapper`` for code that tokenizes requests
    (mlx-lm's server): ``apply_chat_template`` goes through
    :func:`encode_chat`, ``encode`` repairs invalid Unicode; everything else
    is the wrapped tokenizer's.
    """

    def __init__(self, tokenizer):
        self._wrapped = tokenizer

    def __getattr__(self, name):
        return getattr(self._wrapped, name)

    def apply_chat_template(self, messages, tokenize: bool = True, **kwargs):
        if not tokenize:
            return self._wrapped.apply_chat_template(
                _repaired(messages), tokenize=False, **kwargs
            )
        return encode_chat(self._wrapped, messages, **kwargs)

    def encode(self, text, *args, **kwargs):
        if isinstance(text, str):
            text = repair_text(text)
        return self._wrapped.encode(text, *args, **kwargs)
