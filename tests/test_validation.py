"""The one path from user options to a checked SpecConfig, and the drafter check."""

import subprocess
import sys
import types

import pytest

from mlx_spec.cli.generate import setup_arg_parser
from mlx_spec.config import MAX_DRAFT_TOKENS, SpecConfig
from mlx_spec.drafters.fit import check_drafter, drafter_fits
from mlx_spec.validation import (
    DRAFTER_LATER,
    check_chat_template,
    check_chat_template_syntax,
    extra_eos_token_id,
    spec_config,
    spec_config_of_args,
)

EAGLE = types.SimpleNamespace(is_head=True, kind="eagle")
DRAFT = types.SimpleNamespace()  # a loaded draft model


def test_spec_config_returns_the_config_it_checked():
    config = spec_config("tree", DRAFT, num_draft_tokens=7, tree_budget=9)
    assert isinstance(config, SpecConfig)
    assert (config.method, config.num_draft_tokens, config.tree_budget) == (
        "tree",
        7,
        9,
    )
    assert spec_config(None, None).method == "auto"


def test_a_range_error_names_the_field_or_its_flag():
    with pytest.raises(ValueError) as e:
        spec_config(None, None, num_draft_tokens=MAX_DRAFT_TOKENS + 1)
    assert str(e.value) == (
        f"num_draft_tokens={MAX_DRAFT_TOKENS + 1} is out of range: "
        f"an integer from 1 to {MAX_DRAFT_TOKENS}."
    )
    with pytest.raises(ValueError) as e:
        spec_config(None, None, flags=True, temp=-1.0)
    assert str(e.value).startswith("--temp=-1.0 is out of range: a number >= 0")


def test_an_unknown_option_is_one_line():
    with pytest.raises(ValueError, match="unexpected keyword argument 'gamma'"):
        spec_config(None, None, gamma=3)


def test_command_flags_become_the_config_that_runs():
    parser = setup_arg_parser()
    args = parser.parse_args(
        ["--speculative", "lookup", "--num-draft-tokens", "9", "--temp", "0.5"]
    )
    config = spec_config_of_args(args, None, max_tokens=args.max_tokens)
    assert (config.method, config.num_draft_tokens, config.temp) == ("lookup", 9, 0.5)
    assert f"1 to {MAX_DRAFT_TOKENS}" in parser.format_help()  # not a copy of 64
    args = parser.parse_args(["--num-draft-tokens", "0"])
    with pytest.raises(ValueError, match="^--num-draft-tokens=0 is out of range"):
        spec_config_of_args(args)


@pytest.mark.parametrize(
    "method, kind, message",
    [
        ("draft", None, "--speculative draft needs a --draft-model."),
        (
            "eagle",
            None,
            "--speculative eagle needs a trained eagle head as --draft-model; "
            "train one with: mlx_spec train-draft --kind eagle.",
        ),
        (
            "tree",
            "eagle",
            "--speculative tree needs a draft model, not the eagle head given; "
            "use --speculative eagle or eagle-chain.",
        ),
        (
            "medusa",
            "draft",
            "--speculative medusa needs a trained medusa head, not the draft model "
            "given; use --speculative draft or tree, or train one with: "
            "mlx_spec train-draft --kind medusa.",
        ),
    ],
)
def test_a_drafter_that_does_not_fit_gets_one_message(method, kind, message):
    assert not drafter_fits(method, kind)
    with pytest.raises(ValueError) as e:
        check_drafter(method, kind)
    assert str(e.value) == message


def test_a_loaded_drafter_is_checked_and_a_later_one_is_not():
    assert spec_config("eagle", EAGLE).method == "eagle"
    with pytest.raises(ValueError, match="needs a draft model, not the eagle head"):
        spec_config("draft", EAGLE)
    assert spec_config("draft", DRAFTER_LATER).method == "draft"
    for method in ("auto", "lookup", "self", "none"):
        check_drafter(method, None)


def test_import_mlx_spec_loads_neither_server():
    code = (
        "import sys, mlx_spec; "
        "print([m for m in sys.modules if m.startswith(('mlx_spec.serve.server', "
        "'mlx_spec.serve.scheduler', 'mlx_spec.serve.handler', 'mlx_lm.server'))])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"


def test_an_extra_eos_token_is_a_vocabulary_token_or_its_id(load_model):
    _, tokenizer = load_model("llama")
    vocab = tokenizer.get_vocab()
    token, token_id = max(vocab.items(), key=lambda item: item[1])
    assert extra_eos_token_id(tokenizer, token) == token_id
    assert extra_eos_token_id(tokenizer, str(token_id)) == token_id
    for bad in (str(token_id + 1), "-1", token + "\u2603"):
        with pytest.raises(ValueError, match="--extra-eos-token"):
            extra_eos_token_id(tokenizer, bad)


def test_a_chat_template_flag_that_compiles_passes_and_one_that_does_not_is_named(
    load_model,
):
    _, tokenizer = load_model("llama")
    for template in (
        "{% for m in messages %}{{ m['content'] }}{% endfor %}",
        "{% generation %}{{ x }}{% endgeneration %}",  # transformers' own tag
        "{{ raise_exception('a system message first') }}",  # refuses one conversation
    ):
        check_chat_template(template, "--chat-template")
        check_chat_template_syntax(tokenizer, template, "--chat-template")
    for template, line in (
        ("{% for m in messages %}", 1),
        ("{{ x }}\n{{ x | nope }}", 2),
    ):
        with pytest.raises(ValueError) as e:
            check_chat_template_syntax(tokenizer, template, "--chat-template")
        message = str(e.value)
        assert message.startswith(
            f"--chat-template is not a valid Jinja template at line {line}: "
        )
        assert "\n" not in message
    with pytest.raises(ValueError, match="--chat-template is not valid UTF-8"):
        check_chat_template("\udcff", "--chat-template")
