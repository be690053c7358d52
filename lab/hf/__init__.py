"""Hugging Face interop: weights in and out for the families of `lab.hf.families.FAMILIES` (GPT-2, LLaMA,
GPT-NeoX / Pythia, Qwen2, Mistral), and a bridge for the rest.

`from_hf(hf_model)` rewrites an HF causal LM's weights into Forma's per-head layout
(W_Q [head, d_model, d_head], W_O [head, d_head, d_model], ...); `to_hf(model)` does the inverse.
Both are exact: logits agree to float32 round-off (tested, per family and direction). Each family is one file
under lab/hf/families/ and one entry of `FAMILIES`: how its config reads as a ModelConfig and back, which of its
tensors make each Forma module and back, and which of its modules holds each Forma module (for device maps). Any
other architecture goes through TransformerLens's TransformerBridge (`bridge(path)`), which hooks the HF module
tree directly.

Nothing is fetched from a hub: `load_hf` and `bridge` read a local `save_pretrained` folder only, and only if
its safetensors hold exactly the tensors its config.json describes. Nothing in the folder runs as code: every
transformers loader is called with trust_remote_code=False, and a folder that asks for its own code is refused.

The modules: `family` (the Family record, UnsupportedArchitecture, what the families' files share), `families`
(one file per family, and FAMILIES), `convert` (from_hf, to_hf, export_family, empty_model), `device_map` (where
each module of a spread model lives), `folder` (reading and checking a local folder, hf_model_type) and `loading`
(load_hf, bridge).
"""
