"""SAELens' activation store as a peer of Forma's harvest: one hook's activations over the same token batches, on
the same weights, measured in one process of the SAE environment (.venv-sae: sae-lens beside transformer-lens
3.9, which has HookedTransformer; `make venv-sae`).

    forma_harvest          lab.analysis.activations.store.save_activations of Forma's model (lab.hf.convert.from_hf of a
                           transformers GPT2Config model with random weights), every position, float32, into
                           safetensors shards on disk
    saelens_store_tl       SAELens' ActivationsStore over a TransformerLens HookedTransformer holding the same
                           weights (transformer_lens' convert_gpt2_weights of the same Hugging Face model, loaded
                           with no weight processing: no folded norms, no centring), get_raw_llm_batch() once per
                           batch; its rows stay in memory (nothing is written, so SAELens' side is a lower bound
                           on what a harvest to disk through it costs)
    saelens_store_forma    the same store over Forma's model itself (SAELens calls Forma's
                           run_with_cache(names_filter=[hook], stop_at_layer=L, prepend_bos=False))

The store reads the same pre-tokenised sequences as Forma (a datasets.Dataset built in memory with a "tokens"
column: nothing comes from a hub), store_batch_size_prompts = Forma's batch_size, context_size = the sequences'
length. Every round builds each store afresh, so each reads the batches from the first. Agreement: every row of
each store against Forma's shards (rows matched by sequence and position), max |diff|, no centring (no weight
processing on either side). Interleaved rounds, medians. Writes benchmarks/results/harvest_saelens.json
(harvest_saelens_<device>.json off the CPU); benchmarks/summary.py shows it in the harvesting section.

--size smollm2: the same at real size on the zoo's smollm2 (SmolLM2-135M-Instruct, a Llama of 30 layers) and its
middle layer's residual stream: TransformerLens 3.9's HookedTransformer from the config TransformerLens derives for
LlamaForCausalLM (RMSNorm, rotary with the model's base, grouped key/value heads, a gated SiLU MLP) and
convert_llama_weights of the folder transformers reads (nothing fetched); uniform random tokens of its vocabulary.
Writes benchmarks/results/harvest_saelens_smollm2.json.

    .venv-sae/bin/python -m benchmarks.harvest_saelens [--size smollm2] [--rounds 3] [--batch 4] [--batches 2] [--quick]
        [--device cpu]
"""

import argparse
import shutil
import tempfile
import time
import warnings
from importlib.metadata import version
from pathlib import Path
from typing import Any

import torch

from benchmarks.harvest import HOOKS, SEQ_LEN, SIZES, corpus, hf_model
from benchmarks.summary import write_summary
from benchmarks.timing import interleaved, machine, result_name, timed, write
from lab.analysis.activations.store import ActivationStore, save_activations
from lab.folders import zoo_model_dir
from lab.hf.convert import from_hf
from lab.load import load_model

CONTENDERS = ("forma_harvest", "saelens_store_tl", "saelens_store_forma")
SMOLLM2 = "smollm2"
SMOLLM2_HOOK = "blocks.15.hook_resid_post"  # the middle of its 30 layers


def unprocessed(cfg: Any, state_dict: dict) -> Any:
    """A TransformerLens HookedTransformer of `cfg` holding `state_dict` as it is: none of from_pretrained's weight
    processing (no folded norms, no centred weights or unembedding, no folded value biases)."""
    from transformer_lens import HookedTransformer

    model = HookedTransformer(cfg)
    model.load_and_process_state_dict(
        state_dict, fold_ln=False, center_writing_weights=False, center_unembed=False, fold_value_biases=False
    )
    return model.eval()


def tl_model(hf: Any, device: str) -> Any:
    """A TransformerLens HookedTransformer with a GPT-2 Hugging Face model's weights as they are (the config
    TransformerLens derives for GPT2LMHeadModel, none of from_pretrained's weight processing)."""
    from transformer_lens import HookedTransformerConfig
    from transformer_lens.pretrained.weight_conversions import convert_gpt2_weights

    c = hf.config
    cfg = HookedTransformerConfig(
        d_model=c.n_embd,
        d_head=c.n_embd // c.n_head,
        n_heads=c.n_head,
        d_mlp=4 * c.n_embd,
        n_layers=c.n_layer,
        n_ctx=c.n_positions,
        eps=c.layer_norm_epsilon,
        d_vocab=c.vocab_size,
        act_fn=c.activation_function,
        normalization_type="LN",
        original_architecture="GPT2LMHeadModel",
        device=device,
    )
    return unprocessed(cfg, convert_gpt2_weights(hf, cfg))


def tl_llama(hf: Any, device: str, n_ctx: int = SEQ_LEN) -> Any:
    """A TransformerLens HookedTransformer with a Llama Hugging Face model's weights as they are (the config
    TransformerLens derives for LlamaForCausalLM but a context of n_ctx, none of from_pretrained's weight
    processing)."""
    from transformer_lens import HookedTransformerConfig
    from transformer_lens.pretrained.weight_conversions import convert_llama_weights

    c = hf.config
    rope = getattr(c, "rope_parameters", None) or {"rope_theta": c.rope_theta}
    cfg = HookedTransformerConfig(
        d_model=c.hidden_size,
        d_head=c.head_dim,
        n_heads=c.num_attention_heads,
        d_mlp=c.intermediate_size,
        n_layers=c.num_hidden_layers,
        n_ctx=n_ctx,
        eps=c.rms_norm_eps,
        d_vocab=c.vocab_size,
        act_fn=c.hidden_act,
        normalization_type="RMS",
        final_rms=True,
        gated_mlp=True,
        positional_embedding_type="rotary",
        rotary_dim=c.head_dim,
        rotary_base=rope["rope_theta"],
        rotary_adjacent_pairs=False,
        n_key_value_heads=c.num_key_value_heads if c.num_key_value_heads != c.num_attention_heads else None,
        original_architecture="LlamaForCausalLM",
        device=device,
    )
    return unprocessed(cfg, convert_llama_weights(hf, cfg))


def models(size: str, device: str) -> tuple[Any, Any]:
    """Forma's model and TransformerLens' on one set of weights, on `device`: random GPT-2-shaped ones, or
    smollm2's (its zoo folder, which transformers reads as a Llama)."""
    if size == SMOLLM2:
        from transformers import AutoModelForCausalLM

        folder = zoo_model_dir(SMOLLM2)
        hf = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True, dtype=torch.float32).eval()
        return load_model(folder).eval().to(device), tl_llama(hf, device)
    hf = hf_model(size)
    return from_hf(hf).eval().to(device), tl_model(hf, device)


def token_dataset(tokens: torch.Tensor) -> Any:
    """The sequences as SAELens reads a pre-tokenised corpus: a datasets.Dataset with a "tokens" column."""
    from datasets import Dataset

    return Dataset.from_dict({"tokens": tokens.tolist()})


def saelens_rows(
    model: Any, dataset: Any, hook: str, d_in: int, batch: int, batches: int, device: str
) -> list[torch.Tensor]:
    """SAELens' ActivationsStore over `model`: get_raw_llm_batch() `batches` times, each [batch · seq_len, d_in]."""
    from sae_lens.training.activations_store import ActivationsStore

    with warnings.catch_warnings():
        # It warns that the dataset has fewer rows than total_training_tokens (it compares rows with tokens),
        # and, per row, that a tensor is copy-constructed with torch.tensor: neither bears on the rows.
        warnings.simplefilter("ignore")
        store = ActivationsStore(
            model=model,
            dataset=dataset,
            streaming=False,
            hook_name=hook,
            hook_head_index=None,
            context_size=SEQ_LEN,
            d_in=d_in,
            n_batches_in_buffer=1,
            total_training_tokens=batch * batches * SEQ_LEN,
            store_batch_size_prompts=batch,
            train_batch_size_tokens=batch * SEQ_LEN,
            prepend_bos=False,
            normalize_activations="none",
            device=torch.device(device),
            dtype="float32",
        )
        return [store.get_raw_llm_batch()[0] for _ in range(batches)]


def forma_rows(directory: Path, hook: str) -> torch.Tensor:
    """Forma's harvested rows ordered by (sequence, position), as SAELens' batches concatenated are."""
    stored = ActivationStore(directory).load(hook)
    return stored.acts[hook][torch.argsort(stored.seq * SEQ_LEN + stored.pos)]


def compare(size: str, hook: str, batch: int, batches: int, rounds: int, device: str = "cpu") -> dict:
    """Tokens/s of each contender (CONTENDERS) over the same batches, interleaved, and each store's max |diff|
    from Forma's harvest over every row."""
    ours, theirs = models(size, device)
    d_in = ours.cfg.d_model
    tokens = corpus(batch * batches, ours.cfg.d_vocab, seed=1)
    dataset = token_dataset(tokens)
    out = Path(tempfile.mkdtemp(prefix="forma-bench-harvest-saelens-"))
    rows: dict[str, list[torch.Tensor]] = {}

    def harvest() -> None:
        save_activations(ours, tokens, hook, out, positions="all", batch_size=batch, progress=False, overwrite=True)

    def store(name: str, model: Any):
        def run() -> None:
            rows[name] = saelens_rows(model, dataset, hook, d_in, batch, batches, device)

        return run

    try:
        timing = interleaved(
            {
                "forma_harvest": timed(harvest, device),
                "saelens_store_tl": timed(store("saelens_store_tl", theirs), device),
                "saelens_store_forma": timed(store("saelens_store_forma", ours), device),
            },
            rounds=rounds,
            warmup=1,
        )
        forma = forma_rows(out, hook)
    finally:
        shutil.rmtree(out, ignore_errors=True)
    n = tokens.numel()
    diffs = {name: float((torch.cat(parts).cpu() - forma).abs().max()) for name, parts in rows.items()}
    seconds = {name: row["median_s"] for name, row in timing.items()}
    return {
        "device": device,
        "size": size,
        "shape": {key: getattr(ours.cfg, key) for key in ("n_layers", "d_model", "n_heads", "d_vocab")},
        "hook": hook,
        "batch": batch,
        "batches": batches,
        "seq_len": SEQ_LEN,
        "tokens_per_round": n,
        "rows": {"forma_harvest": len(forma)} | {name: sum(len(p) for p in parts) for name, parts in rows.items()},
        "rms_activation": float(forma.pow(2).mean().sqrt()),
        "rounds": rounds,
        "timing": timing,
        "tokens_per_s": {name: n / s for name, s in seconds.items()},
        "throughput_vs_saelens_tl": seconds["saelens_store_tl"] / seconds["forma_harvest"],
        "throughput_vs_saelens_forma": seconds["saelens_store_forma"] / seconds["forma_harvest"],
        "max_abs_diff_vs_forma": diffs,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", help="where the models run (default cpu; e.g. cuda)")
    parser.add_argument("--size", default="gpt2-small", choices=[*SIZES, SMOLLM2], help="smollm2: the real model")
    parser.add_argument("--hook", default=None, help=f"default {HOOKS['middle']} ({SMOLLM2_HOOK} on smollm2)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch", type=int, default=4, help="sequences per batch (SAELens' store_batch_size_prompts)")
    parser.add_argument("--batches", type=int, default=2, help="batches per timed round")
    parser.add_argument("--quick", action="store_true", help="a smoke run: one round of one batch, nothing written")
    args = parser.parse_args(argv)
    if min(args.rounds, args.batch, args.batches) < 1:
        parser.error(
            f"--rounds, --batch and --batches must be at least 1, got {args.rounds}, {args.batch}, {args.batches}"
        )
    if args.quick:
        args.rounds, args.batch, args.batches = 1, 1, 1
    args.hook = args.hook or (SMOLLM2_HOOK if args.size == SMOLLM2 else HOOKS["middle"])
    torch.manual_seed(0)
    start = time.perf_counter()
    result = compare(args.size, args.hook, args.batch, args.batches, args.rounds, args.device)
    payload = {
        "benchmark": "harvest_saelens",
        "machine": machine(),
        "quick": args.quick,
        "versions": {pkg: version(pkg) for pkg in ("sae-lens", "transformer-lens", "datasets")},
        **result,
        "target_throughput_vs_saelens": 2.0,
        "wall_s": time.perf_counter() - start,
        "note": "random weights (smollm2: its own) and uniform random tokens (speed does not depend on them); "
        "SAELens' rows stay in memory while Forma's are written to disk; the machine's cores may be shared with other "
        "work, so times are indicative and ratios, measured interleaved in one process, are the "
        "figures to read",
    }
    name = "harvest_saelens" + ("_smollm2" if args.size == SMOLLM2 else "")
    path = None if args.quick else write(result_name(name, args.device), payload)
    rate = result["tokens_per_s"]
    print(
        f"{args.size}, {args.hook}: Forma harvest {rate['forma_harvest']:.0f} tokens/s; SAELens' ActivationsStore "
        f"{rate['saelens_store_tl']:.0f} tokens/s on TransformerLens ({result['throughput_vs_saelens_tl']:.2f}×, "
        f"target ≥ 2×), {rate['saelens_store_forma']:.0f} tokens/s on Forma's model "
        f"({result['throughput_vs_saelens_forma']:.2f}×); max |diff| from Forma's rows: "
        + ", ".join(f"{name} {d:.1e}" for name, d in result["max_abs_diff_vs_forma"].items())
    )
    if path:
        write_summary(args.device.split(":")[0])
    print(f"wrote {path} and the summary" if path else "quick run: nothing written")


if __name__ == "__main__":
    main()
