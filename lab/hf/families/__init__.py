"""The Hugging Face families Forma converts, each in its own file here, registered in `FAMILIES` (by model_type).
Adding a family is one file (its `Family`: config and weights each way, and the tiny config tests build it from)
and its entry below, beside its import; the conversion, device maps, loading and the tests' parametrised fixtures
read this table (docs/design.md, "Add a Hugging Face family")."""

from lab.hf.families import gpt2, llama, neox
from lab.hf.family import Family

FAMILIES: dict[str, Family] = {
    family.model_type: family
    for family in (
        gpt2.GPT2,
        llama.LLAMA,
        neox.NEOX,
        llama.QWEN2,
        llama.MISTRAL,
    )
}
SUPPORTED = tuple(FAMILIES)  # the Hugging Face model_type of each family Forma converts
