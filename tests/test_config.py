"""SpecConfig: every bad knob value gets a one-line ValueError naming it."""

import argparse

import pytest

from mlx_spec import SpecConfig


@pytest.mark.parametrize(
    "knobs, field",
    [
        (dict(method="fast"), "speculative"),
        (dict(num_draft_tokens=0), "num_draft_tokens"),
        (dict(num_draft_tokens=True), "num_draft_tokens"),  # a bool is not a count
        (dict(num_draft_tokens=2.5), "num_draft_tokens"),
        (dict(temp=-1), "temp"),
        (dict(temp="hot"), "temp"),
        (dict(top_p=-0.1), "top_p"),
        (dict(top_p=1.5), "top_p"),
        (dict(top_k=-1), "top_k"),
        (dict(top_k=2**70), "top_k"),  # past int32: std::bad_cast in mlx_lm's sampler
        (dict(min_tokens_to_keep=2**70), "min_tokens_to_keep"),
        (dict(min_p=1.5), "min_p"),
        (dict(max_tokens=0), "max_tokens"),
        (dict(tree_budget=0), "tree_budget"),
        (dict(tree_top_k=17), "tree_top_k"),
        (dict(ngram_min=0), "ngram_min"),
        (dict(ngram_max=17), "ngram_max"),
        (dict(ngram_min=4, ngram_max=2), "ngram_min"),
        (dict(lookup_candidates=False), "lookup_candidates"),
        (dict(adaptive="no"), "adaptive"),
        (dict(adaptive=1), "adaptive"),
        (dict(draft_p_min="high"), "draft_p_min"),
        (dict(draft_p_min=1.0), "draft_p_min"),
        (dict(seed="x"), "seed"),
        (dict(seed=-1), "seed"),
        (dict(seed=2**64), "seed"),
        (dict(profile=None), "profile"),
    ],
)
def test_bad_knob_is_one_line_error_naming_it(knobs, field):
    with pytest.raises(ValueError) as err:
        SpecConfig(**knobs)
    message = str(err.value)
    assert "\n" not in message and message.startswith(field), message


def test_defaults_are_adaptive_and_valid():
    config = SpecConfig()
    assert config.adaptive is True and config.draft_p_min == 0.0
    assert SpecConfig(adaptive=False, draft_p_min=0.5, seed=3).seed == 3


def test_sampling_flags_are_checked_with_mlx_lm_meanings():
    from mlx_spec.validation import spec_config_of_args

    # top_p 0 and 1 both turn top-p off, as in mlx_lm.
    spec_config_of_args(argparse.Namespace(temp=0.0, top_p=0.0, min_p=0.0, top_k=0))
    for name, value in (("temp", -1.0), ("top_p", 1.5), ("min_p", 2.0), ("top_k", -1)):
        flag = name.replace("_", "-")
        with pytest.raises(ValueError, match=f"--{flag}={value} is out of range"):
            spec_config_of_args(argparse.Namespace(**{name: value}))
