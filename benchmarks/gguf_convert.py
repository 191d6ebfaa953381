"""Seconds and peak memory of ``mlx_spec.convert gguf`` on files of a given size.

For each size a random llama-architecture GGUF is written with gguf-py's
writer (Q8_0 matrices, F32 norms, a synthetic byte-level vocabulary; hidden
size 1024, vocabulary 32,000, as many layers as the size needs), tensor by
tensor so that building it holds one tensor at a time. Each conversion runs in
a fresh process; its peak resident memory is the kernel's count for that
process (``os.wait4``), and the same interpreter importing the converter and
doing nothing else gives the baseline.

    python -m benchmarks.gguf_convert [--sizes-mb 100 1000] [--dtypes float32 keep-quantized]

Prints one JSON line per conversion and a Markdown table; exits 1 if a peak
exceeds the written checkpoint's size plus 25%.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import List

import numpy as np

HIDDEN = 1024
INTERMEDIATE = 2816
HEADS, KV_HEADS = 16, 4
VOCAB = 32000
QTYPE = "Q8_0"
# The bound: peak RSS under the written checkpoint's size + 25%.
BOUND = 1.25
MB = 1 << 20
_IMPORTS = "import mlx_spec.convert.gguf, mlx_lm, gguf, tokenizers"


def layer_shapes() -> dict:
    """GGUF base name -> (rows, cols) of one block's matrices."""
    head_dim = HIDDEN // HEADS
    return {
        "attn_q": (HIDDEN, HIDDEN),
        "attn_k": (KV_HEADS * head_dim, HIDDEN),
        "attn_v": (KV_HEADS * head_dim, HIDDEN),
        "attn_output": (HIDDEN, HIDDEN),
        "ffn_gate": (INTERMEDIATE, HIDDEN),
        "ffn_up": (INTERMEDIATE, HIDDEN),
        "ffn_down": (HIDDEN, INTERMEDIATE),
    }


def num_layers(size_mb: float) -> int:
    """Blocks that bring the file nearest ``size_mb`` (Q8_0: 34 bytes per 32)."""
    per_weight = 34 / 32
    fixed = 2 * VOCAB * HIDDEN * per_weight
    per_layer = sum(r * c for r, c in layer_shapes().values()) * per_weight
    return max(1, round((size_mb * MB - fixed) / per_layer))


def tensor_plan(layers: int) -> list:
    """``(name, shape, type)`` of every tensor, in file order."""
    plan = [("token_embd.weight", (VOCAB, HIDDEN), QTYPE)]
    for i in range(layers):
        plan.append((f"blk.{i}.attn_norm.weight", (HIDDEN,), "F32"))
        for base, shape in layer_shapes().items():
            plan.append((f"blk.{i}.{base}.weight", shape, QTYPE))
        plan.append((f"blk.{i}.ffn_norm.weight", (HIDDEN,), "F32"))
    plan.append(("output_norm.weight", (HIDDEN,), "F32"))
    plan.append(("output.weight", (VOCAB, HIDDEN), QTYPE))
    return plan


def synthetic_vocabulary() -> list:
    """``VOCAB`` distinct tokens: 256 single characters, then pairs of them."""
    byte_chars = [chr(c) for c in range(0x21, 0x7F)] + [
        chr(c) for c in range(0xA1, 0x143)
    ]
    tokens = list(byte_chars)
    for a in byte_chars:
        for b in byte_chars:
            if len(tokens) == VOCAB:
                return tokens
            tokens.append(a + b)
    return tokens


def write_gguf(path: Path, layers: int, seed: int = 0) -> int:
    """Write the random model; return the file's size in bytes."""
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_context_length(4096)
    writer.add_embedding_length(HIDDEN)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(INTERMEDIATE)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt2")
    tokens = synthetic_vocabulary()
    writer.add_token_list(tokens)
    writer.add_token_merges([f"{t[0]} {t[1]}" for t in tokens[256:]])
    plan = tensor_plan(layers)
    kind = gguf.GGMLQuantizationType[QTYPE]
    block, size = gguf.GGML_QUANT_SIZES[kind]
    for name, shape, qtype in plan:
        if qtype == "F32":
            writer.add_tensor_info(name, shape, np.dtype(np.float32), 4 * shape[0])
        else:
            byte_shape = (shape[0], shape[1] // block * size)
            nbytes = byte_shape[0] * byte_shape[1]
            writer.add_tensor_info(
                name, byte_shape, np.dtype(np.uint8), nbytes, raw_dtype=kind
            )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    rng = np.random.default_rng(seed)
    for name, shape, qtype in plan:
        values = rng.standard_normal(shape, dtype=np.float32) * 0.02
        if qtype == "F32":
            writer.write_tensor_data(values + 1)
        else:
            writer.write_tensor_data(gguf.quants.quantize(values, kind))
    writer.close()
    return path.stat().st_size


def run_measured(code: str) -> tuple:
    """Run ``python -c code`` in a fresh process: ``(seconds, peak RSS bytes)``."""
    start = time.perf_counter()
    child = subprocess.Popen([sys.executable, "-c", code])
    _, status, usage = os.wait4(child.pid, 0)
    seconds = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"benchmarks.gguf_convert: error: {code!r} failed")
    # ru_maxrss: KiB on Linux, bytes on macOS.
    scale = 1 if sys.platform == "darwin" else 1024
    return seconds, usage.ru_maxrss * scale


def checkpoint_bytes(out: Path) -> int:
    return sum(f.stat().st_size for f in out.iterdir() if f.is_file())


def measure(path: Path, out: Path, dtype: str) -> dict:
    """Convert ``path`` in a fresh process; the figures of that run."""
    code = (
        "from mlx_spec.convert import convert_gguf; "
        f"convert_gguf({str(path)!r}, {str(out)!r}, dtype={dtype!r}, progress=False)"
    )
    seconds, peak = run_measured(code)
    written = checkpoint_bytes(out)
    return {
        "gguf_mb": round(path.stat().st_size / MB, 1),
        "dtype": dtype,
        "seconds": round(seconds, 1),
        "peak_rss_mb": round(peak / MB, 1),
        "checkpoint_mb": round(written / MB, 1),
        "bound_mb": round(BOUND * written / MB, 1),
        "within_bound": peak <= BOUND * written,
    }


def setup_arg_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.gguf_convert", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--sizes-mb", type=float, nargs="+", default=[100, 1000])
    parser.add_argument("--dtypes", nargs="+", default=["float32", "keep-quantized"])
    parser.add_argument(
        "--dir", default=None, help="where to write the files (default: a temp dir)"
    )
    return parser


def table(rows: List[dict], baseline_mb: float) -> str:
    lines = [
        f"imports alone: {baseline_mb:.0f} MB peak RSS",
        "",
        "| GGUF | dtype | seconds | peak RSS | checkpoint | checkpoint + 25% |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['gguf_mb']:.0f} MB | {r['dtype']} | {r['seconds']:.1f} | "
            f"{r['peak_rss_mb']:.0f} MB | {r['checkpoint_mb']:.0f} MB | "
            f"{r['bound_mb']:.0f} MB |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    args = setup_arg_parser().parse_args(argv)
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        root = Path(tmp)
        _, baseline = run_measured(_IMPORTS)
        rows = []
        for size in args.sizes_mb:
            path = root / f"random-{size:g}mb.gguf"
            write_gguf(path, num_layers(size))
            for dtype in args.dtypes:
                out = root / f"out-{size:g}-{dtype}"
                row = measure(path, out, dtype)
                print(json.dumps(row), flush=True)
                rows.append(row)
                for f in out.iterdir():
                    f.unlink()
                out.rmdir()
            path.unlink()
    print(table(rows, baseline / MB))
    return 0 if all(r["within_bound"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
