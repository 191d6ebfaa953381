"""The data stages of ``mlx_spec train-draft``: prompts and the target's
completions, or a committed corpus; the learning curve; stage timing.
"""

import json
import os
import resource
import sys
import time
from pathlib import Path
from typing import Dict, List

from ..features import FINAL, check_feature_layers, feature_owner
from . import completions as C
from . import head_command as H
from .cli_options import draft_reads_features, int_list
from .corpus_data import heldout_budget
from .prompts import load_prompt_file, mixed_prompts, prompt_counts, split_of

# What a learning-curve point keeps of its run's selection.
SELECTION_POINT = ("shards", "new_tokens", "replay_tokens", "seen_tokens")


def log(message: str):
    """One progress line of the run, on stderr."""
    print(f"[train-draft] {message}", file=sys.stderr, flush=True)


def kept_feature_layers(args, model, data_dir: Path) -> List[int]:
    """The features the data keeps: ``--keep-features``, else the folder's, else the run's.

    A new folder keeps what this run reads (:func:`read_feature_layers`), so
    its head needs no teacher-forced pass; a folder already made keeps its
    own, which the completions it adds must match.
    """
    from ..features import check_feature_layers

    if args.keep_features:
        layers = int_list(args.keep_features, "keep-features")
    else:
        layers = _saved_feature_layers(data_dir) or read_feature_layers(args, model)
    return list(check_feature_layers(model, layers))


def _saved_feature_layers(data_dir: Path) -> List[int]:
    """The features a data folder keeps, from its manifests (none if it has none)."""
    for name in ("train.json", "heldout.json"):  # held-out data is made first
        manifest = data_dir / name
        if manifest.exists():
            saved = json.loads(manifest.read_text(encoding="utf-8"))
            return list(saved.get("feature_layers") or [])
    return []


def read_feature_layers(args, model) -> List[int]:
    """The target features this run's drafter reads: a head's, else the final state."""
    if args.kind == "draft":
        return [FINAL]
    return H.head_feature_layers(args, args.kind, len(feature_owner(model).layers))


def choose_prompts(args):
    """Training and held-out prompts (built-in, or a file split by a hash of each text)."""
    if args.prompts:
        rows = load_prompt_file(args.prompts)
        train = [p for p in rows if split_of(p.text) == "train"]
        heldout = [p for p in rows if split_of(p.text) == "heldout"]
        if not heldout and len(train) > 1:
            heldout = train[-1:]
            train = train[:-1]
        return train[: args.num_prompts], heldout[: args.heldout_prompts]
    train = mixed_prompts(args.num_prompts, "train", seed=args.seed)
    heldout = mixed_prompts(args.heldout_prompts, "heldout", seed=args.seed)
    return train, heldout


def _cpu_share(wall: float, cpu: float) -> str:
    cores = os.cpu_count() or 1
    return f"{cpu / max(wall, 1e-9) / cores:.0%} of {cores} cores"


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def stage_time(tic: float, cpu: float) -> Dict:
    wall = time.perf_counter() - tic
    used = cpu_seconds() - cpu
    return {
        "wall_s": round(wall, 1),
        "cpu_s": round(used, 1),
        "share": _cpu_share(wall, used),
    }


def corpus_stage(args, model, out: Path):
    """Training data from a corpus (see :mod:`.corpus_data`).

    Returns:
        ``(train, heldout, data record, held-out prompt ids for the engine)``.
    """
    from .corpus import Corpus
    from .corpus_data import corpus_completions, corpus_tokens, heldout_set
    from .corpus_prompts import CHAT_FAMILIES

    corpus = Corpus(args.corpus)
    if args.kind == "draft":
        layers = [FINAL] if draft_reads_features(args) else []
    else:
        layers = H.head_feature_layers(
            args, args.kind, len(feature_owner(model).layers)
        )
    store = layers
    if args.keep_features:  # one prefill for several drafters: a superset is cached
        store = list(
            check_feature_layers(model, int_list(args.keep_features, "keep-features"))
        )
        if not set(layers) <= set(store):
            raise ValueError(
                f"--keep-features {args.keep_features} must include the features "
                f"this run reads ({','.join(map(str, layers))})."
            )
    laws = args.labels == "laws"  # else no feature is read, nor kept (check_labels)
    options = dict(
        feature_layers=layers,
        store_layers=store,
        top_k=args.top_k,
        cache=args.cache,
        log=log,
        laws=laws,
    )
    budget = heldout_budget(args)
    # Held-out first: a budget below its first sequence stops before any prefill.
    heldout = heldout_set(model, corpus, budget, **options)
    heldout_total = corpus_tokens(corpus, "heldout")
    prior = prior_data(args, out)
    selection = select_corpus_shards(args, corpus, out, prior)
    train = corpus_completions(
        model, corpus, "train", shards=set(selection.shards), **options
    )
    if not len(train) or not len(heldout):
        raise ValueError(
            f"the corpus in '{args.corpus}' has {len(train)} training and "
            f"{len(heldout)} held-out sequences; grow it until it has both."
        )
    log(
        f"corpus: {len(train)} train ({train.completion_tokens} tokens), "
        f"{len(heldout)} held out ({heldout.completion_tokens} of its "
        f"{heldout_total} held-out tokens; --heldout-tokens {budget}); labels: "
        + ("the target's laws" if laws else "the written tokens (no target prefill)")
    )
    record = {
        "corpus": Path(args.corpus).name,
        "train_prompts": len(train),
        "train_sets": _counts(train.prompt_sets),
        "train_prompt_tokens": train.prompt_tokens,
        "train_completion_tokens": train.completion_tokens,
        "heldout_prompts": len(heldout),
        "heldout_completion_tokens": heldout.completion_tokens,
        "heldout_budget": budget,
        "heldout_all": heldout.completion_tokens == heldout_total,
        "labels": args.labels,
        "top_k": args.top_k if laws else None,
        "selection": selection.record(args.corpus_tokens, args.seed),
        "learning_curve": list(prior.get("learning_curve", [])),
    }
    chat = [
        t[:s].tolist()
        for t, s, p in zip(heldout.tokens, heldout.starts, heldout.prompt_sets)
        if p in CHAT_FAMILIES
    ] or [t[:s].tolist() for t, s in zip(heldout.tokens, heldout.starts)]
    return train, heldout, record, chat


def _counts(names) -> Dict[str, int]:
    out: Dict[str, int] = {}
    for n in names:
        out[n] = out.get(n, 0) + 1
    return out


def prior_data(args, out: Path) -> Dict:
    """The data record so far (its learning curve, the corpus it names): that of
    ``--init-from``, else of ``--out``'s drafter (empty if neither has one)."""
    for folder in (args.init_from, out):
        path = Path(folder) / "config.json" if folder else None
        if path is not None and path.is_file():
            try:
                config = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, json.JSONDecodeError):
                continue
            return dict(config.get("data", {}))
    return {}


def select_corpus_shards(args, corpus, out: Path, prior: Dict):
    """The training shards of this run (``--corpus-select``, see :mod:`.corpus_select`).

    What the drafter has seen comes from ``prior``'s learning curve. A
    ``newest`` selection is kept in ``OUT/data``, so a resumed run trains on
    the shards it began with however much the corpus has grown meanwhile.
    """
    from .corpus_data import shard_train_tokens
    from .corpus_select import (
        SELECTION_FILE,
        ranges_text,
        save_selection,
        saved_selection,
        seen_shards,
        select_shards,
    )

    tokens = shard_train_tokens(corpus)
    seen = set()
    trained_on = prior.get("corpus")
    if trained_on in (None, corpus.folder.name):
        seen = seen_shards(prior.get("learning_curve", []), tokens)
    else:
        log(
            f"the drafter so far trained on another corpus ({trained_on}): no shard seen"
        )
    mode, budget = args.corpus_select or "first", args.corpus_tokens
    if mode == "first":  # stable as the corpus grows: nothing to keep
        selection = select_shards(tokens, mode, budget, seen=seen)
    else:
        key = {"mode": mode, "corpus": corpus.folder.name, "budget": budget}
        key.update(seed=args.seed, seen=ranges_text(seen))
        path = out / "data" / SELECTION_FILE
        selection = saved_selection(path, key, set(tokens))
        if selection is not None:
            log(f"kept the shards this run began with ({path})")
        else:
            selection = select_shards(tokens, mode, budget, seen=seen, seed=args.seed)
            save_selection(path, key, selection)
    log(
        f"corpus selection {mode}: {len(selection.new)} shards not seen before "
        f"({selection.new_tokens} tokens), {len(selection.replay)} seen before "
        f"({selection.replay_tokens} tokens); budget {budget or 'all'}"
    )
    return selection


def learning_point(kind: str, record: Dict, last_eval: Dict, steps: int) -> Dict:
    """One point of the learning curve: corpus tokens trained on, held-out acceptance."""
    selection = record.get("selection", {})
    point = {
        "corpus_tokens": record["train_completion_tokens"],
        **{k: selection[k] for k in SELECTION_POINT if k in selection},
        "heldout_tokens": record["heldout_completion_tokens"],
        "heldout_budget": record.get("heldout_budget"),
        "steps": steps,
        "labels": record.get("labels", "laws"),
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
    }
    heads = (
        "accept_by_depth",
        "conditional_by_depth",
        "tokens_per_round",
        "tree_nodes",
        "tree_tokens_per_round",
    )
    names = {"draft": ("alpha", "best_tokens_per_forward", "best_gamma")}.get(
        kind, heads
    )
    point.update({n: last_eval[n] for n in names if n in last_eval})
    return point


def add_learning_point(out: Path, point: Dict):
    """Append ``point`` to the learning curve in ``OUT/config.json``."""
    from ..drafters.heads import CONFIG_FILE

    path = out / CONFIG_FILE
    config = json.loads(path.read_text(encoding="utf-8"))
    data = config.setdefault("data", {})
    data["learning_curve"] = list(data.get("learning_curve", [])) + [point]
    path.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")


def completions_stage(args, model, tokenizer, data_dir: Path, timing: Dict):
    """Stages 1-2: prompts and the target's completions (with laws and features).

    Returns:
        ``(train, heldout, data record, held-out prompt ids for the engine)``.
    """
    from ..fingerprint import model_fingerprint

    progress = not args.no_progress
    train_prompts, heldout_prompts = choose_prompts(args)
    if args.self_instruct:
        from .self_instruct import self_instruct_prompts

        # After the other prompts, so their completions already made are kept.
        own_train, own_heldout = self_instruct_prompts(
            model,
            tokenizer,
            args.self_instruct,
            data_dir / "self-instruct.jsonl",
            seed=args.seed,
            progress=progress,
            log=log,
        )
        train_prompts += own_train
        heldout_prompts += own_heldout
    if not train_prompts or not heldout_prompts:
        raise ValueError("need at least one training and one held-out prompt.")
    log(
        f"prompts: train {prompt_counts(train_prompts)}, held out {prompt_counts(heldout_prompts)}"
    )

    # Stage 2: the target's completions (resumed shard by shard).
    tic, cpu = time.perf_counter(), cpu_seconds()
    common = dict(
        sampled_share=args.sampled_share,
        sampled_temp=args.sampled_temp,
        max_tokens=args.max_tokens,
        top_k=args.top_k,
        batch_size=args.gen_batch,
        seed=args.seed,
        target=model_fingerprint(model),
        features=args.kind != "draft" or draft_reads_features(args),
        feature_layers=kept_feature_layers(args, model, data_dir),
        progress=progress,
        log=log,
    )
    # The held-out set is small: made first, so a partial run can be measured.
    heldout = C.build_completions(
        model,
        tokenizer,
        heldout_prompts,
        data_dir,
        "heldout",
        **{**common, "sampled_share": 0.0},
    )
    train = C.build_completions(
        model, tokenizer, train_prompts, data_dir, "train", **common
    )
    timing["data"] = stage_time(tic, cpu)
    log(
        f"completions: {len(train)} train ({train.completion_tokens} tokens), "
        f"{len(heldout)} held out ({heldout.completion_tokens} tokens)"
    )
    data_record = {
        "train_prompts": len(train),
        "train_sets": prompt_counts(train_prompts),
        "train_prompt_tokens": train.prompt_tokens,
        "train_completion_tokens": train.completion_tokens,
        "generation_minutes": round((train.seconds + heldout.seconds) / 60, 1),
        "heldout_prompts": len(heldout),
        "heldout_completion_tokens": heldout.completion_tokens,
        "sampled_share": args.sampled_share,
        "sampled_temp": args.sampled_temp,
        "max_tokens": args.max_tokens,
        "top_k": args.top_k,
        "prompt_file": os.path.basename(args.prompts) if args.prompts else None,
        "self_instruct": args.self_instruct,
    }
    return train, heldout, data_record, eval_prompt_ids(tokenizer, heldout_prompts)


def eval_prompt_ids(tokenizer, heldout_prompts) -> List[List[int]]:
    """Token ids of the held-out chat prompts (all held-out prompts if none is chat)."""
    chat = [p for p in heldout_prompts if p.prompt_set == "chat"] or list(
        heldout_prompts
    )
    return [C.encode_prompt(tokenizer, p) for p in chat]
