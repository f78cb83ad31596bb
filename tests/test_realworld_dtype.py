"""``deepspec realworld build --dtype bfloat16 | float16`` (and float32) as a user runs it, on a small random-weight
Llama GGUF file carrying SmolLM2's real metadata and tokenizer (tests/helpers/small_gguf.py) instead of the 135M
model, whose dequantization alone takes 15-20 s. For each dtype: the build's greedy check passed; every tensor
of the saved safetensors is in that dtype and equals, bit for bit, the GGUF-loaded model's parameter rounded to
it; config.json names the dtype and has no ``quantization_config``; the manifest records the dtype and the
file's SHA-256; the saved tokenizer encodes a chat as the GGUF one does. Each file is parsed once for the module
(``gguf_files_parsed_once``): a few seconds per dtype on one core.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch

from deepspec_train.commands.dispatch import main as deepspec
from tests.helpers.real_world import wheel_missing

pytestmark = pytest.mark.usefixtures("one_torch_thread")

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
CHAT = [{"role": "system", "content": "You answer in one line."},
        {"role": "user", "content": "What is 17 × 23? Reply like a café menu: « 391 » ✓"},
        {"role": "assistant", "content": "17 × 23 = 391."},
        {"role": "user", "content": "And\tin Python?\n```python\nprint(17 * 23)\n```"}]


@pytest.fixture(scope="module")
def small_gguf(tmp_path_factory: pytest.TempPathFactory):
    """The small file, parsed once for the whole module (each parse of its vocabulary costs about 2 s)."""
    missing = wheel_missing()
    if missing:
        pytest.skip(missing)
    from tests.helpers.small_gguf import gguf_files_parsed_once, write_small_gguf

    with gguf_files_parsed_once():
        yield write_small_gguf(tmp_path_factory.mktemp("small-gguf") / "smollm2-small.F32.gguf")


@pytest.fixture(scope="module")
def gguf_loaded(small_gguf: Path):
    """The small file's model (float32 parameters) and tokenizer, loaded the way the build loads them."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(small_gguf.parent, gguf_file=small_gguf.name)
    model = AutoModelForCausalLM.from_pretrained(small_gguf.parent, gguf_file=small_gguf.name).eval()
    assert all(p.dtype == torch.float32 for p in model.parameters())
    return model, tokenizer


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.view({2: torch.int16, 4: torch.int32}[tensor.element_size()])


def _saved_tensors(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors import safe_open

    tensors = {}
    for file in sorted(folder.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as handle:
            tensors.update({key: handle.get_tensor(key) for key in handle.keys()})
    return tensors


def _chat_ids(tokenizer) -> list[int]:
    return tokenizer.apply_chat_template(CHAT, add_generation_prompt=True, return_dict=True)["input_ids"]


def test_the_small_gguf_is_a_tiny_llama_that_does_not_decode_degenerately(small_gguf: Path, gguf_loaded) -> None:
    model, tokenizer = gguf_loaded
    config = model.config
    assert (config.model_type, config.num_hidden_layers, config.hidden_size, config.intermediate_size) == \
        ("llama", 2, 64, 128)
    assert (config.num_attention_heads, config.num_key_value_heads, config.head_dim) == (4, 2, 16)
    assert config.vocab_size == len(tokenizer) == 49152 and config.tie_word_embeddings
    ids = torch.tensor([_chat_ids(tokenizer)])
    with torch.no_grad():
        answer = model.generate(ids, max_new_tokens=16, do_sample=False,
                                pad_token_id=tokenizer.pad_token_id)[0, ids.shape[1]:].tolist()
    # Random weights, but the answer depends on the context: not one token repeated.
    assert len(answer) == 16 and len(set(answer)) > 3, answer


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_the_build_saves_the_gguf_model_in_the_asked_dtype(dtype: str, small_gguf: Path, gguf_loaded,
                                                          tmp_path: Path, capsys) -> None:
    from transformers import AutoTokenizer

    out = tmp_path / "target"
    assert deepspec(["realworld", "build", "--gguf", str(small_gguf), "--out", str(out), "--dtype", dtype]) == 0
    printed = capsys.readouterr().out
    assert f"parameters in {dtype}" in printed and "greedy check equal" in printed and "DIFFERENT" not in printed

    manifest = json.loads((out / "realworld.json").read_text())
    check = manifest["greedy_check"]
    assert check["passed"] and check["prompts"] and all(item["equal"] for item in check["prompts"])
    # Answers that differ by prompt: the check compared real decoding, not overflowed (NaN) logits in both.
    assert all(item["tokens"] > 0 for item in check["prompts"])
    assert len({item["answer"] for item in check["prompts"]}) == len(check["prompts"])
    assert manifest["dtype"] == dtype
    assert manifest["source"]["sha256"] == hashlib.sha256(small_gguf.read_bytes()).hexdigest()
    assert manifest["source"]["architecture"] == "llama"

    config = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in config and config["dtype"] == dtype

    # Every saved tensor is in the dtype and equals the GGUF-loaded parameter rounded to it, bit for bit (the tied
    # head is the embedding: named_parameters lists it once, as the saved file does).
    model, tokenizer = gguf_loaded
    expected = {name: p.detach().to(DTYPES[dtype]) for name, p in model.named_parameters()}
    saved = _saved_tensors(out)
    assert saved.keys() == expected.keys()
    for name, tensor in saved.items():
        assert tensor.dtype == DTYPES[dtype], name
        assert tensor.shape == expected[name].shape and torch.equal(_bits(tensor), _bits(expected[name])), name
    if dtype != "float32":  # the rounding is real: the float32 weights do not fit the dtype exactly
        assert any(not torch.equal(saved[name].float(), p) for name, p in model.named_parameters())

    reloaded = AutoTokenizer.from_pretrained(out)
    assert reloaded.chat_template == tokenizer.chat_template and "<|im_start|>" in reloaded.chat_template
    assert _chat_ids(reloaded) == _chat_ids(tokenizer)
    text = reloaded.apply_chat_template(CHAT, tokenize=False)
    assert reloaded(text)["input_ids"] == tokenizer(text)["input_ids"]
    assert (reloaded.eos_token_id, reloaded.pad_token_id, reloaded.bos_token_id) == \
        (tokenizer.eos_token_id, tokenizer.pad_token_id, tokenizer.bos_token_id)
