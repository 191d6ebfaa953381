"""Statistical checks that a sampled token stream follows given exact laws."""

import numpy as np

# 99.9% quantile of chi-square with 9 degrees of freedom.
CHI2_9_999 = 27.88


def stream_statistics(
    laws: np.ndarray, tokens: np.ndarray, seed: int = 0, bins: int = 10
):
    """Two statistics of tokens drawn one by one, each from its own law.

    Args:
        laws: The exact law of each position given its prefix, ``(n, V)``.
        tokens: The sampled tokens, ``(n,)``.

    Returns:
        ``(chi2, z)``: chi-square (``bins - 1`` degrees of freedom) of the
        randomized probability integral transforms, taken in order of
        decreasing probability, and the standardised sum of ``log p(token)``
        (about N(0, 1); negative when unlikely tokens are emitted too often,
        positive when likely ones are).
    """
    rows = np.arange(len(tokens))
    p = laws[rows, tokens]
    above = np.where(laws > p[:, None], laws, 0.0).sum(axis=1)
    u = above + np.random.default_rng(seed).random(len(tokens)) * p
    counts = np.histogram(np.clip(u, 0, 1 - 1e-12), bins=bins, range=(0, 1))[0]
    expected = len(tokens) / bins
    chi2 = ((counts - expected) ** 2 / expected).sum()
    logp = np.log(np.maximum(laws, 1e-300))
    mean = (laws * logp).sum(axis=1)
    var = (laws * logp**2).sum(axis=1) - mean**2
    z = (logp[rows, tokens] - mean).sum() / np.sqrt(var.sum())
    return chi2, z


def assert_counts_follow_law(counts: np.ndarray, law: np.ndarray):
    """Chi-square test at the 99.9% level that ``counts`` are draws from ``law``.

    Tokens expected fewer than 5 times are lumped into one bin; the
    quantile uses the Wilson-Hilferty approximation.
    """
    expected = law * counts.sum()
    big = expected >= 5
    obs = np.append(counts[big], counts[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    keep = exp > 0
    chi2 = ((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum()
    dof = keep.sum() - 1
    bound = dof * (1 - 2 / (9 * dof) + 3.09 * np.sqrt(2 / (9 * dof))) ** 3
    assert chi2 < bound, (chi2, bound)
