"""The ``mlx_spec.generate`` command: ``mlx_lm.generate``'s flags and output,
plus ``--speculative``, the method options and the speculation statistics."""

import argparse
import json
import sys
from pathlib import Path
from typing import List

import mlx.core as mx
from mlx_lm.generate import setup_arg_parser as mlx_lm_arg_parser

from mlx_spec_entry import guarded

from ..chat_text import repair_text
from ..config import DEFAULT_NUM_DRAFT_TOKENS, MAX_DRAFT_TOKENS
from ..distributed import (
    errors_in_one_line,
    rank,
    rank0_prints,
    sharded_group,
    shared_seed,
    text_from_rank0,
)
from ..generation import DEFAULT_MAX_TOKENS, collect_text, stream_generate
from ..loading import (
    default_model_pair,
    load_target,
    resolve_draft,
    skip_unused_draft,
)
from ..options import add_speculative_options, one_line_errors
from ..outdir import check_out_file
from ..validation import (
    extra_eos_token_id,
    json_object_option,
    spec_config_of_args,
)


def setup_arg_parser() -> argparse.ArgumentParser:
    """mlx_lm.generate's parser plus the speculative options."""
    parser = one_line_errors(mlx_lm_arg_parser())
    parser.prog = "mlx_spec.generate"
    parser.description = (
        "Speculative text generation with MLX (a superset of mlx_lm.generate)."
    )
    parser.set_defaults(
        num_draft_tokens=DEFAULT_NUM_DRAFT_TOKENS,
        max_tokens=DEFAULT_MAX_TOKENS,
        prefill_step_size=512,
    )
    for action in parser._actions:
        if action.dest == "model":
            action.help = (
                "The path to the local model directory or Hugging Face repo. Default: "
                "the embedded default pair in models/ (with its draft)."
            )
        if action.dest == "num_draft_tokens":
            action.help = (
                f"Draft tokens per round, 1 to {MAX_DRAFT_TOKENS} "
                f"(default: {DEFAULT_NUM_DRAFT_TOKENS})."
            )
        if action.dest == "prefill_step_size":
            action.help = "Prompt tokens processed at a time (default: 512)."
    group = add_speculative_options(parser)
    group.add_argument(
        "--stats-json",
        default=None,
        metavar="PATH",
        help="Write the speculation statistics as JSON to PATH.",
    )
    group.add_argument(
        "--pipeline",
        action="store_true",
        help="Under mlx.launch: shard the target in pipeline stages instead of "
        "tensor-parallel.",
    )
    group.add_argument(
        "--profile",
        action="store_true",
        help="Split round time into drafting and verification (adds a sync per round).",
    )
    return parser


def _check_args(args):
    """The flags of mlx_lm.generate that mlx_spec does not take, and --stats-json
    (the other flags: :func:`~mlx_spec.validation.spec_config_of_args`)."""
    if args.xtc_probability > 0:
        raise ValueError(
            "--xtc-probability is not supported by mlx_spec; use mlx_lm.generate."
        )
    if args.image:
        raise ValueError("--image is not supported by mlx_spec; use mlx_lm.generate.")
    if args.prompt_cache_file:
        raise ValueError(
            "--prompt-cache-file is not supported by mlx_spec yet; use mlx_lm.generate."
        )
    if args.stats_json and rank() == 0:  # checked now, not after generating
        check_out_file(args.stats_json, "--stats-json")


def _read_stdin() -> str:
    raw = getattr(sys.stdin, "buffer", None)  # bytes: bad UTF-8 becomes U+FFFD
    return raw.read().decode("utf-8", "replace") if raw else sys.stdin.read()


def _build_prompt(args, tokenizer) -> List[int]:
    prompt = args.prompt.replace("\\n", "\n").replace("\\t", "\t")
    if prompt == "-":  # rank 0's stdin, on every rank of a sharded run
        prompt = text_from_rank0(_read_stdin() if rank() == 0 else "", sharded_group())
    prompt = repair_text(prompt)  # invalid UTF-8 in argv arrives as surrogates
    if not prompt:
        raise ValueError(
            "the prompt is empty; pass --prompt TEXT (or - to read stdin)."
        )
    use_chat_template = not args.ignore_chat_template and tokenizer.has_chat_template
    if use_chat_template:
        messages = []
        if args.system_prompt is not None:
            system = repair_text(args.system_prompt)
            messages.append({"role": "system", "content": system})
        messages.append({"role": "user", "content": prompt})
        has_prefill = args.prefill_response is not None
        if has_prefill:
            prefill = repair_text(args.prefill_response)
            messages.append({"role": "assistant", "content": prefill})
        template_kwargs = {}
        if args.chat_template_config is not None:
            template_kwargs = json_object_option(
                args.chat_template_config, "--chat-template-config"
            )
        prompt = tokenizer.apply_chat_template(
            messages,
            tokenize=False,
            continue_final_message=has_prefill,
            add_generation_prompt=not has_prefill,
            **template_kwargs,
        )
    return tokenizer.encode(prompt, add_special_tokens=not use_chat_template)


def run(args) -> str:
    _check_args(args)
    model_path, draft_path = args.model, args.draft_model
    if model_path is None:
        model_path, default_draft = default_model_pair(args.speculative)
        draft_path = draft_path or default_draft
    config = spec_config_of_args(args, draft_path, max_tokens=args.max_tokens)
    draft_path = skip_unused_draft(config.method, draft_path)
    seed = shared_seed(args.seed)  # ranks draw alike
    if seed is not None:
        mx.random.seed(seed)
    model, tokenizer = load_target(
        model_path,
        pipeline=args.pipeline,
        adapter_path=args.adapter_path,
        tokenizer_config={"trust_remote_code": args.trust_remote_code},
        model_config={"quantize_activations": args.quantize_activations},
    )
    for eos_token in args.extra_eos_token:
        tokenizer.add_eos_token(str(extra_eos_token_id(tokenizer, eos_token)))
    draft_model = resolve_draft(
        args.speculative, model_path, draft_path, model, tokenizer
    )
    prompt = _build_prompt(args, tokenizer)
    stream = stream_generate(
        model,
        tokenizer,
        prompt,
        draft_model=draft_model,
        config=config,
        max_kv_size=args.max_kv_size,
        prefill_step_size=args.prefill_step_size,
        kv_bits=args.kv_bits,
        kv_group_size=args.kv_group_size,
        quantized_kv_start=args.quantized_kv_start,
    )
    text = collect_text(stream, args.verbose)
    if not args.verbose:
        print(text)
    if args.stats_json and rank() == 0:  # one file for the group
        try:
            with open(Path(args.stats_json).expanduser(), "w") as f:
                json.dump(stream.stats.as_dict(), f, indent=2)
        except OSError as e:  # a folder that cannot be written
            raise ValueError(f"--stats-json {args.stats_json}: {e.strerror}.") from None
    return text


def main(argv=None):
    parser = setup_arg_parser()
    args = parser.parse_args(argv)
    rank0_prints()  # a sharded run: rank 0 prints for all
    try:
        with errors_in_one_line(parser, (ValueError, FileNotFoundError, OSError)):
            run(args)
    except KeyboardInterrupt:
        parser.exit(130, "\n")


if __name__ == "__main__":
    guarded(main)
