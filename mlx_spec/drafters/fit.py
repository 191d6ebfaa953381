"""Which drafter each method drafts with, and the one check that a drafter fits.

A drafter's *kind* is ``None`` (none given), ``"draft"`` (a draft model),
``"eagle"`` or ``"medusa"`` (a trained head) or ``"mtp"`` (a checkpoint's
MTP layer). Every front end (commands, server, UI) and every drafter asks
:func:`check_drafter`, so the rule and its message live here once.
"""

from typing import NamedTuple, Optional

# Methods that need a draft model (a trained head will not do).
DRAFT_METHODS = ("draft", "tree")
# Methods that draft without a draft model or head (one given goes unused).
DRAFTLESS_METHODS = ("none", "lookup", "self")
# The drafter each method drafts with: the ``kind`` a train-draft directory records.
METHOD_KINDS = {
    "draft": "draft",
    "tree": "draft",
    "eagle": "eagle",
    "eagle-chain": "eagle",
    "medusa": "medusa",
    "dflash": "dflash",
}
# What each method needs once loaded (``mtp`` reads the checkpoint's MTP layer).
NEEDED_DRAFTER = dict(METHOD_KINDS, mtp="mtp")


def drafter_kind(draft_model) -> Optional[str]:
    """The kind of a loaded drafter: ``None``, ``"draft"`` or a head's kind."""
    if draft_model is None:
        return None
    return draft_model.kind if getattr(draft_model, "is_head", False) else "draft"


def drafter_description(kind: Optional[str]) -> str:
    """``a distilled draft model``, ``a trained eagle head``, ..."""
    if kind is None:
        return "no drafter"
    if kind == "mtp":
        return "the model's MTP layer"
    if kind == "dflash":
        return "a DFlash drafter"
    return "a draft model" if kind == "draft" else f"a trained {kind} head"


def drafter_methods(kind: str) -> str:
    """The methods that draft with a ``kind`` drafter: ``eagle or eagle-chain``."""
    return " or ".join(m for m, k in NEEDED_DRAFTER.items() if k == kind) or "auto"


def drafter_fits(method: str, kind: Optional[str]) -> bool:
    """Whether ``method`` can draft with a drafter of ``kind``."""
    needed = NEEDED_DRAFTER.get(method)
    return needed is None or needed == kind


class Words(NamedTuple):
    """How a front end names its choices in :func:`check_drafter`'s messages."""

    # The request: "{method}" is the method asked for.
    subject: str = "--speculative {method}"
    # Where a drafter is given ("needs a {draft_model}", "as {draft_model}").
    draft_model: str = "--draft-model"
    # How to choose other methods: "{methods}" is "eagle or eagle-chain".
    pick: str = "use --speculative {methods}"


# The commands' words (flags); the UI names its page's controls instead.
FLAG_WORDS = Words()


def check_drafter(
    method: str, kind: Optional[str], *, subject: str = "", words: Words = FLAG_WORDS
) -> None:
    """A one-line ``ValueError`` unless ``method`` can draft with a ``kind`` drafter.

    Args:
        method: The method that will run.
        kind: The drafter on hand (see the module docstring).
        subject: How the front end names the request. Default:
          ``words.subject`` (``--speculative METHOD``).
        words: How the front end names its choices. Default: the flags.
    """
    if drafter_fits(method, kind):
        return
    needed = NEEDED_DRAFTER[method]
    subject = subject or words.subject.format(method=method)
    if needed == "mtp":
        raise ValueError(
            f"{subject} drafts with the model's own MTP layer (got "
            f"{drafter_description(kind)}); load it with mlx_spec.load_mtp(path, "
            "model) (the commands do this from --model)."
        )
    if kind is None and needed == "draft":
        raise ValueError(f"{subject} needs a {words.draft_model}.")
    wanted = drafter_description(needed)
    train = f"train one with: mlx_spec train-draft --kind {needed}"
    if needed == "dflash":  # a published format only
        train = "pass a published DFlash checkpoint folder"
    if kind is None:
        raise ValueError(f"{subject} needs {wanted} as {words.draft_model}; {train}.")
    given = "the draft model given" if kind == "draft" else f"the {kind} head given"
    fix = words.pick.format(methods=drafter_methods(kind))
    if needed != "draft":
        fix += f", or {train}"
    raise ValueError(f"{subject} needs {wanted}, not {given}; {fix}.")
