"""SmolLM2-135M-Instruct, the zoo's real language model, built from the wheel's GGUF: its weights, logits,
tokenizer, chat template, hooks and greedy decoding against transformers' own reading of the same file and
TransformerLens's TransformerBridge over the same Hugging Face model (docs/real-model.md)."""

import random
import re

import pytest
import torch
from safetensors.torch import load_file

from lab import HookedTransformer
from lab.load import load_model
from lab.model.generation import generate
from lab.trust import hf_tolerance
from tests.builders import smollm2_folder, transformers_from_gguf

pytestmark = pytest.mark.real

PROMPTS = [
    "The capital of France is Paris. The capital of Italy is",
    "def fibonacci(n):\n    return n if n < 2 else",
    "When Mary and John went to the store, John gave a drink to",
]


@pytest.fixture(scope="module")
def folder():
    return smollm2_folder()


@pytest.fixture(scope="module")
def reference():
    return transformers_from_gguf()


@pytest.fixture(scope="module")
def model(folder):
    return load_model(folder)


def ids(tokenizer, text):
    return torch.tensor([tokenizer(text, add_special_tokens=False).input_ids])


def test_the_built_weights_are_transformers_dequantization_of_the_same_file_bit_for_bit(folder, reference):
    ours = load_file(str(folder / "model.safetensors"))
    theirs = reference[0].state_dict()
    assert set(ours) == set(theirs) - {"lm_head.weight"}  # tied: the embedding is the unembedding
    for name, tensor in ours.items():
        assert tensor.dtype == torch.float32 and torch.equal(tensor, theirs[name]), name


def test_logits_equal_transformers_on_text_prompts(model, reference):
    hf, tokenizer = reference
    with torch.no_grad():
        for text in PROMPTS:
            tokens = ids(tokenizer, text)
            theirs = hf(tokens).logits
            assert (model(tokens) - theirs).abs().max().item() <= hf_tolerance(theirs), text
    top = model(ids(tokenizer, PROMPTS[0]))[0, -1].argmax()
    assert tokenizer.decode(top) == " Rome"


def test_logits_equal_transformers_on_a_padded_batch_of_texts(model, reference):
    hf, tokenizer = reference
    for side in ("left", "right"):
        tokens = model.to_tokens(PROMPTS, prepend_bos=False, padding_side=side)
        mask = (tokens != model.tokenizer.pad_token_id).long()
        with torch.no_grad():
            ours = model(PROMPTS, prepend_bos=False, padding_side=side)
            theirs = hf(tokens, attention_mask=mask).logits
        real = mask.bool()
        assert (ours[real] - theirs[real]).abs().max().item() <= hf_tolerance(theirs[real]), side


def varied_strings(n: int, seed: int = 0) -> list[str]:
    """n strings mixing words, Unicode (accents, CJK, emoji, combining marks, RTL), whitespace runs, code, digits
    and the chat format's special tokens."""
    rng = random.Random(seed)
    pieces = [
        "The quick brown fox",
        " jumps over",
        "naïve café résumé",
        "東京は日本の首都です",
        "Привет, мир",
        "مرحبا بالعالم",
        "🙂🚀👩‍👩‍👧",
        "e\u0301",
        "   ",
        "\t\t",
        "\n\n\n",
        "  \n ",
        "def f(x):\n    return x ** 2",
        "for (int i = 0; i < n; i++) { a[i] += 1; }",
        "x = {'a': [1, 2, 3]}",
        "3.14159",
        "1234567890",
        " 2026-12-04",
        "$1,000,000",
        "0x1F",
        "<|im_start|>",
        "<|im_end|>",
        "I'm",
        "they'll",
        "don't",
        "HTTP/1.1 200 OK",
        "a" * 40,
        "!!!???",
        "—–-",
        "\u00a0nbsp",
    ]
    return ["".join(rng.choice(pieces) for _ in range(rng.randint(1, 6))) for _ in range(n)]


def test_the_tokenizer_equals_transformers_on_a_thousand_varied_strings(model, reference):
    """Equal token for token, except where whitespace runs into a digit: the model splits digits off before its
    byte-level split (its own tokenizer's and llama.cpp's "smollm" pre-tokenizer), which transformers' GGUF
    conversion does not know, so "\\n\\n\\n3" is ["\\n\\n\\n", "3"] here and ["\\n\\n", "\\n", "3"] there. Every
    string decodes to itself both ways."""
    _, theirs = reference
    strings = sorted(set(varied_strings(2000)))
    equal = 0
    for text in strings:
        ours = model.tokenizer(text, add_special_tokens=False).input_ids
        other = theirs(text, add_special_tokens=False).input_ids
        assert model.tokenizer.decode(ours) == theirs.decode(other) == text, repr(text)
        if ours == other:
            equal += 1
        else:
            assert re.search(r"\s\d", text), repr(text)  # the one documented difference
    assert equal >= 1000, (equal, len(strings))


def test_the_chat_template_renders_as_transformers_apply_chat_template(model, reference):
    _, theirs = reference
    chats = [
        [{"role": "user", "content": "What is the capital of Italy?"}],
        [
            {"role": "system", "content": "You answer in one word."},
            {"role": "user", "content": "Capital of France?"},
            {"role": "assistant", "content": "Paris"},
            {"role": "user", "content": "And of Japan?"},
        ],
    ]
    for chat in chats:
        for prompt in (False, True):
            ours = model.tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=prompt)
            assert ours == theirs.apply_chat_template(chat, tokenize=False, add_generation_prompt=prompt)
            assert ours.startswith("<|im_start|>")


def test_every_hook_equals_the_transformer_bridge_over_the_same_hugging_face_model(folder, model):
    """TransformerBridge (raw mode, no weight processing) over transformers' model of the built folder: every hook
    name both have holds the same activation, at every layer."""
    from transformer_lens.model_bridge import TransformerBridge
    from transformers import AutoModelForCausalLM, AutoTokenizer

    hf = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=False, local_files_only=True).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=False, local_files_only=True)
    bridge = TransformerBridge.boot_transformers("LlamaForCausalLM", hf_model=hf, tokenizer=tokenizer, device="cpu")
    bridge.enable_compatibility_mode(disable_warnings=True, no_processing=True)
    tokens = model.to_tokens(PROMPTS[0], prepend_bos=False)
    with torch.no_grad():
        ours_logits, ours = model.run_with_cache(tokens)
        theirs_logits, theirs = bridge.run_with_cache(tokens)
    shared = [name for name in ours.keys() if name in theirs.keys()]
    assert len(shared) >= 30 * 10, len(shared)  # every block's residual stream, attention and MLP hooks at least
    for name in shared:
        a, b = ours[name], theirs[name]
        assert a.shape == b.shape and torch.equal(a.isinf(), b.isinf()), name  # the causal mask's -inf alike
        finite = a.isfinite()
        assert ((a - b).abs() <= 2e-4 + 1e-4 * b.abs())[finite].all(), name  # round-off at the activation's size
    assert (ours_logits - theirs_logits).abs().max().item() <= hf_tolerance(theirs_logits)


def test_greedy_generation_with_the_kv_cache_equals_recompute_and_transformers(model, reference):
    hf, tokenizer = reference
    prompt = ids(tokenizer, PROMPTS[0])
    kwargs = dict(max_new_tokens=40, do_sample=False, stop_at_eos=False, verbose=False)
    cached = generate(model, prompt, use_past_kv_cache=True, **kwargs)
    recomputed = generate(model, prompt, use_past_kv_cache=False, **kwargs)
    with torch.no_grad():
        theirs = hf.generate(
            prompt,
            attention_mask=torch.ones_like(prompt),
            max_new_tokens=40,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=tokenizer.pad_token_id,
        )
    assert cached.shape == (1, prompt.shape[1] + 40)
    assert torch.equal(cached, recomputed) and torch.equal(cached, theirs)


def test_transformer_lens_style_code_reads_it_as_transformer_lens_would(folder):
    """Text in, TransformerLens's conventions: the tokenizer's BOS prepended, to_str_tokens, get_act_name."""
    from transformer_lens.utilities import get_act_name

    model = HookedTransformer.from_pretrained("smollm2")
    tokens = model.to_tokens("The capital of Italy is")
    assert tokens[0, 0].item() == model.tokenizer.bos_token_id
    assert model.to_str_tokens("The capital of Italy is") == ["<|im_start|>", "The", " capital", " of", " Italy", " is"]
    logits, cache = model.run_with_cache("The capital of Italy is")
    resid = cache[get_act_name("resid_post", 29)]
    assert resid.shape == (1, 6, 576) and cache[get_act_name("pattern", 0)].shape == (1, 9, 6, 6)
    assert model.to_string(logits[0, -1].argmax()) == " Rome"


def test_a_bfloat16_build_stores_half_the_bytes_and_reads_as_the_float32_model_rounded(tmp_path, folder, model):
    """`forma build smollm2 --dtype bfloat16`: every weight is the float32 build's rounded to bfloat16, and the model
    it loads gives the same next token on the prompts."""
    from lab.zoo.imports import import_model

    out = import_model("smollm2", dtype="bfloat16", out=tmp_path / "smollm2")
    half, full = load_file(str(out / "model.safetensors")), load_file(str(folder / "model.safetensors"))
    assert all(half[name].dtype == torch.bfloat16 and torch.equal(half[name], full[name].bfloat16()) for name in full)
    assert (out / "model.safetensors").stat().st_size < 0.51 * (folder / "model.safetensors").stat().st_size
    bf16 = load_model(out)
    with torch.no_grad():
        for text in PROMPTS:
            tokens = model.to_tokens(text, prepend_bos=False)
            assert bf16(tokens)[0, -1].argmax() == model(tokens)[0, -1].argmax(), text


def test_forma_hooks_and_forma_trust_on_smollm2(tmp_path, folder, capsys):
    """The commands a user runs first: every hook point and its shape, and the trust report (Hugging Face logits,
    fused against explicit attention, the KV cache, every hook firing) passing."""
    import json

    from lab.cli.parser import main

    assert main(["hooks", "smollm2", "--tokens", "4"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 605 and "blocks.29.hook_resid_post                [1, 4, 576]" in lines
    assert main(["trust", "smollm2", "--out", str(tmp_path / "trust.json")]) == 0
    report = json.loads((tmp_path / "trust.json").read_text())
    hf = report["hugging_face"]
    assert report["passed"] and hf["max_abs_logit_diff"] <= hf["tolerance"] <= 1e-4 + 1e-5 * 40  # logits under 40
