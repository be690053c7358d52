"""The real-model track: SmolLM2-135M-Instruct (the zoo's `smollm2`) fine-tuned on the biography corpus
(`biographies`) at several monofact rates set by design, and the Kalai–Vempala quantities measured on it.

What is read. For a person, the prompt is "First Last was born in"; every city of CITIES is one token after it,
so g(city | person) is one next-token probability, and the mass on every other token is the model's "other"
(it continues otherwise: abstains, hedges, names no city of the world) — neither fact nor hallucination, reported
apart, as the toy's malformed mass is (docs/definitions.md §2). With the world's law p over persons
(`Corpus.p`: MF on the held-out persons), the model's law over factoids is g(person, city) = p(person)·g(city |
person) and the truth's p(person, city) = p(person)·[city is the person's]. Then

* hallucination rate g(H) = Σ p(person) Σ_{city wrong} g(city | person), and the same mean on each kind of
  person (held out, seen once, repeated): the held-out persons' is the rate on unseen singleton-like facts;
* miscalibration Mis = ‖p^Π − g‖_TV in ε-log bins (`lab.metrics.hallucination.bin_table`, as the toy's);
* the bound's main part MF − Mis, its full right side at δ = 0.1 (`bound_slack`, vacuous here: |F|/|H| = 1/15
  makes 3e^(−s)/δ = 2), and the margin g(H) − (MF − Mis), each with a 95% bootstrap interval over persons,
  resampled within each kind (`lab.metrics.discrimination.bootstrap_ci`).

The answer rule (per prompt, tested): the model's greedy next token. A city is an answer — correct or a
hallucination — and any other token is "no answer" (abstention or another continuation). The pretrained model's
behaviour on invented persons is read the same way on the plain prompt, and in its chat form ("Where was First
Last born?", greedy reply of REPLY_TOKENS tokens) classified by `classify_reply`: an abstention phrase
(ABSTAIN_PATTERN) is an abstention, anything else asserts something about a person who does not exist.

What is trained. The last `trained_blocks` transformer blocks (attention, MLP and their norms); the embeddings
(tied to the unembedding), the other blocks and the final norm are frozen. Loss on the city token only. Each
rate starts from the pretrained weights and trains with `lab.train.loop.train` into out/finetune/mf-<rate>/
(checkpoints, metrics.jsonl): an interrupted run continues with the same --out, to the same bits; a finished
rate's measurements are written (measured.json) and its checkpoint then removed (≈ 0.5 GB each).
"""

import os
import re
import resource
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from experiments import peak_rss_gb
from experiments.hallucination.biographies import CITIES, Corpus, build_corpus, question_words
from experiments.hallucination.config import EPS, Config, RealProfile
from lab.metrics.discrimination import bootstrap_ci
from lab.metrics.hallucination import bin_table, bound_slack
from lab.outside_files import read_json
from lab.runs import headline, write_json

LABEL = "SmolLM2-135M-Instruct, 4-bit GGUF dequantized"
CORPUS_LABEL = "synthetic biographies of invented persons (one birth city each, 16 cities)"
REPLY_TOKENS = 16
REAL_THREADS = 2  # the two cores the quick profile is sized for
DELTA = 0.1  # the full bound's confidence level (δ = 0.01 only makes its vacuous slack larger)
ABSTAIN_PATTERN = re.compile(
    r"\b(i (do not|don't|cannot|can't|am not able to|am unable to) (know|find|provide|say|determine|access)|"
    r"not sure|no (information|record|data|details)|i'm not aware|i am not aware|not familiar|unknown|"
    r"i'm sorry|i am sorry|couldn't find|could not find|unable to (find|provide|determine)|not able to find)",
    re.IGNORECASE,
)


# --------------------------------------------------------------------------------------------
# Rules and measurements on numbers (no model): tested on constructed cases
# --------------------------------------------------------------------------------------------
def classify_reply(text: str, cities: tuple[str, ...] = CITIES) -> str:
    """A chat reply about an invented person: "abstain" (an abstention phrase), "city" (names a city of the
    world), else "asserts" (it says something else as if the person were real)."""
    if ABSTAIN_PATTERN.search(text):
        return "abstain"
    if any(re.search(rf"\b{re.escape(c)}\b", text) for c in cities):
        return "city"
    return "asserts"


def greedy_outcome(greedy_city: np.ndarray, true_city: np.ndarray) -> np.ndarray:
    """Each prompt's outcome under the answer rule: "correct", "hallucinated" (a wrong city), "no_answer"
    (the greedy next token is no city: greedy_city = −1)."""
    return np.where(greedy_city < 0, "no_answer", np.where(greedy_city == true_city, "correct", "hallucinated"))


def _quantities(p: np.ndarray, probs: np.ndarray, true_city: np.ndarray, mf: float) -> dict[str, float]:
    """g(H), g(F), Mis (ε-log TV) and MF − Mis on persons with weights p (renormalised to 1)."""
    p = p / p.sum()
    truth = np.zeros_like(probs)
    truth[np.arange(len(p)), true_city] = 1.0
    g = p[:, None] * probs
    g_facts = float((g * truth).sum())
    g_hall = float(g.sum()) - g_facts
    mis = bin_table(g.ravel(), (p[:, None] * truth).ravel(), "eps", EPS).miscalibration
    return {"hallucination_rate": g_hall, "fact_rate": g_facts, "miscalibration": mis, "bound": mf - mis}


def measure_rate(
    p: np.ndarray,
    probs: np.ndarray,
    true_city: np.ndarray,
    kind: np.ndarray,
    greedy_city: np.ndarray,
    mf: float,
    n_train: int,
    n_boot: int,
    seed: int,
) -> dict[str, Any]:
    """Everything measured at one monofact rate from the readings (probs [person, city], the greedy city or −1),
    each of g(H), Mis, MF − Mis and the margin with its bootstrap interval over persons (within each kind)."""
    out: dict[str, Any] = {"monofact_rate": mf, **_quantities(p, probs, true_city, mf)}
    out["other_rate"] = 1.0 - out["hallucination_rate"] - out["fact_rate"]
    out["margin"] = out["hallucination_rate"] - out["bound"]
    for key in ("hallucination_rate", "miscalibration", "bound", "margin"):

        def metric(pp, pr, tc, key=key):
            q = _quantities(pp, pr, tc, mf)
            return q["hallucination_rate"] - q["bound"] if key == "margin" else q[key]

        ci = bootstrap_ci(metric, p, probs, true_city, strata=kind, n_boot=n_boot, seed=seed)
        out[f"{key}_interval"] = [ci.low, ci.high]
    n_persons, n_cities = probs.shape
    full = bound_slack(
        out["hallucination_rate"], mf, out["miscalibration"], n_persons, n_persons * (n_cities - 1), n_train, DELTA
    )
    out |= {"bound_full_rhs": full.right_side, "bound_full_slack": full.slack, "delta": DELTA, "n_train": n_train}
    outcome = greedy_outcome(greedy_city, true_city)
    wrong = probs.sum(axis=1) - probs[np.arange(len(p)), true_city]
    out["by_kind"] = {
        k: {
            "n": int((kind == k).sum()),
            "wrong_city_mass": float(wrong[kind == k].mean()),
            "true_city_mass": float(probs[kind == k, true_city[kind == k]].mean()),
            "other_mass": float(1.0 - probs[kind == k].sum(axis=1).mean()),
            **{o: float((outcome[kind == k] == o).mean()) for o in ("correct", "hallucinated", "no_answer")},
        }
        for k in ("heldout", "single", "repeated")
        if (kind == k).any()
    }
    return out


# --------------------------------------------------------------------------------------------
# Reading the model
# --------------------------------------------------------------------------------------------
def city_ids(tokenizer: Any) -> list[int]:
    """Each city's one token after a space; a ValueError if a tokenizer splits one (the reading needs one token)."""
    ids = [tokenizer.encode(" " + c, add_special_tokens=False) for c in CITIES]
    split = [c for c, i in zip(CITIES, ids) if len(i) != 1]
    if split:
        raise ValueError(f"the tokenizer splits {', '.join(split)} into several tokens: the reading needs one each")
    return [i[0] for i in ids]


def read_prompts(model: Any, prompts: list[str], cities: list[int], batch: int = 16) -> tuple[np.ndarray, np.ndarray]:
    """(probs [prompt, city]: the next-token probability of each city, greedy [prompt]: the city index of the
    greedy next token, −1 when it is no city), from one forward pass per batch of right-padded prompts read at
    each prompt's last token (a causal model: the padding after it changes nothing before it)."""
    tok = model.tokenizer
    rows = [tok.encode(t, add_special_tokens=False) for t in prompts]
    probs, greedy = [], []
    lookup = {t: i for i, t in enumerate(cities)}
    with torch.inference_mode():
        for start in range(0, len(rows), batch):
            chunk = rows[start : start + batch]
            width = max(len(r) for r in chunk)
            ids = torch.tensor([r + [r[-1]] * (width - len(r)) for r in chunk])
            logits = model(ids).double()
            last = logits[torch.arange(len(chunk)), torch.tensor([len(r) - 1 for r in chunk])]
            dist = last.softmax(-1)
            probs.append(dist[:, cities].numpy())
            greedy += [lookup.get(int(t), -1) for t in dist.argmax(-1)]
    return np.concatenate(probs), np.array(greedy)


def chat_replies(model: Any, names: list[str]) -> list[str]:
    """The chat model's greedy replies to "Where was NAME born?" (REPLY_TOKENS tokens at most), decoded in one
    batch padded on the left (lab.model.generation: each row as if alone)."""
    tok = model.tokenizer
    texts = [
        tok.apply_chat_template(
            [{"role": "user", "content": f"Where was {n} born?"}], tokenize=False, add_generation_prompt=True
        )
        for n in names
    ]
    ids, _ = model.tokenize(texts, prepend_bos=False, padding_side="left")
    out = model.generate(
        ids, max_new_tokens=REPLY_TOKENS, do_sample=False, prepend_bos=False, padding_side="left", return_type="tokens"
    )
    return [tok.decode(row[ids.shape[1] :].tolist(), skip_special_tokens=True).strip() for row in out]


def pretrained_behaviour(model: Any, corpus: Corpus, cities: list[int], n_chat: int) -> dict[str, Any]:
    """What the pretrained model does with the invented (held-out) persons, before any fine-tuning: the plain
    prompt's city mass and greedy outcome, and the chat form's replies, classified."""
    heldout = np.flatnonzero(corpus.kind == "heldout")
    probs, greedy = read_prompts(model, [corpus.prompt(i) for i in heldout], cities)
    true = np.array(corpus.cities)[heldout]
    outcome = greedy_outcome(greedy, true)
    names = [corpus.names[i] for i in heldout[:n_chat]]
    replies = chat_replies(model, names)
    classes = [classify_reply(r) for r in replies]
    share = {c: classes.count(c) / len(classes) for c in ("abstain", "city", "asserts")}
    verdict = "abstains" if share["abstain"] > 0.5 else "hallucinates" if share["abstain"] < 0.5 else "mixed"
    return {
        "n_prompts": len(heldout),
        "city_mass": float(probs.sum(axis=1).mean()),
        "wrong_city_mass": float((probs.sum(axis=1) - probs[np.arange(len(true)), true]).mean()),
        **{f"greedy_{o}": float((outcome == o).mean()) for o in ("correct", "hallucinated", "no_answer")},
        "chat": [{"name": n, "reply": r, "class": c} for n, r, c in zip(names, replies, classes)],
        "chat_share": share,
        "verdict": verdict,
    }


# --------------------------------------------------------------------------------------------
# Fine-tuning
# --------------------------------------------------------------------------------------------
def trainable(model: Any, blocks: int) -> list[str]:
    """Freeze everything but the last `blocks` blocks; the names of the trained parameters."""
    model.requires_grad_(False)
    first = model.cfg.n_layers - blocks
    for layer in range(first, model.cfg.n_layers):
        model.blocks[layer].requires_grad_(True)
    return [name for name, p in model.named_parameters() if p.requires_grad]


def sentence_batches(model: Any, corpus: Corpus) -> tuple[Any, int]:
    """(SequenceBatches of the training sentences, the held-out persons' as validation; seq_len): every sentence
    padded to one length, the loss on the city token only."""
    from lab.train.batches import SequenceBatches, pad_documents

    tok = model.tokenizer
    pad = tok.eos_token_id

    def rows(people: list[int]) -> tuple[torch.Tensor, torch.Tensor, int]:
        ids, scored = [], []
        for i in people:
            prompt = tok.encode(corpus.prompt(i), add_special_tokens=False)
            sentence = tok.encode(corpus.sentence(i), add_special_tokens=False)
            ids.append(sentence)
            scored.append([t == len(prompt) for t in range(len(sentence))])  # the city token
        return ids, scored

    trained = [i for i, c in enumerate(corpus.counts) for _ in range(int(c))]
    heldout = list(np.flatnonzero(corpus.kind == "heldout"))
    train_ids, train_scored = rows(trained)
    val_ids, val_scored = rows(heldout)
    length = max(len(r) for r in train_ids + val_ids)
    t, tm = pad_documents(train_ids, pad, length, train_scored)
    v, vm = pad_documents(val_ids, pad, length, val_scored)
    return SequenceBatches(t, v, tm, vm), length


def finetune(
    model: Any, corpus: Corpus, size: RealProfile, seed: int, folder: Path, stop_after: int | None = None
) -> dict[str, Any]:
    """Train the unfrozen blocks on the corpus with lab.train.loop.train into `folder`, resuming its checkpoint
    when one is there (`stop_after`: end this call after that step, as an interruption would); the training's
    record (steps, losses, seconds)."""
    from lab.train.checkpoint import CHECKPOINT_DIR, has_checkpoint
    from lab.train.config import TrainConfig
    from lab.train.loop import train

    data, length = sentence_batches(model, corpus)
    cfg = TrainConfig(
        steps=size.steps,
        batch_size=size.batch_size,
        seq_len=length,
        lr=size.lr,
        min_lr=size.lr / 10,
        warmup_steps=2,
        weight_decay=0.0,
        eval_interval=size.steps,
        eval_batches=1,
        checkpoint_every_s=60.0,
        seed=seed,
    )
    resume = has_checkpoint(folder / CHECKPOINT_DIR)
    result = train(model, cfg, data, out_dir=folder, resume=resume, stop_after=stop_after)
    return {
        "steps": result.step,
        "train_loss_nats": result.train_loss_nats,
        "heldout_loss_nats": result.best_val_loss_nats,
        "seconds": result.elapsed_s,
        "resumed": resume,
        "sentences_seen": size.steps * size.batch_size,
    }


# --------------------------------------------------------------------------------------------
# Headlines
# --------------------------------------------------------------------------------------------
def bound_headline(rates: list[dict[str, Any]]) -> dict[str, Any]:
    """g(H) ≥ MF − Mis, judged by the margin's interval at the rates where MF − Mis > 0 (elsewhere it holds whatever
    the model does, and says nothing): it holds where every such interval lies above 0, fails where one lies below,
    and is not supported where one straddles 0, nor where MF − Mis ≤ 0 at every rate (vacuous)."""
    informative = [r for r in rates if r["bound"] > 0]
    if not informative:
        why = "bound vacuous: MF − Mis ≤ 0 at every rate, so g(H) ≥ MF − Mis holds whatever the model does"
        return headline("bound_holds", "The bound's main part MF − Mis constrains g(H).", None, None, 0, False, why)
    worst = min(r["margin"] for r in informative)
    text = (
        f"Where MF − Mis > 0 ({len(informative)} of {len(rates)} monofact rates), the hallucination rate exceeds it "
        f"(smallest margin {worst:+.3f})."
    )
    failed = [r["monofact_rate"] for r in informative if r["margin_interval"][1] < 0]
    unsure = [r["monofact_rate"] for r in informative if r["margin_interval"][0] <= 0 <= r["margin_interval"][1]]
    if failed:
        why = "the bound fails: the margin's interval lies below 0 at MF = " + ", ".join(f"{m:.3f}" for m in failed)
        return headline("bound_holds", text, worst, None, -1, False, why)
    if unsure:
        why = "the margin's 95% interval straddles 0 at MF = " + ", ".join(f"{m:.3f}" for m in unsure)
        return headline("bound_holds", text, worst, None, 0, False, why)
    return headline("bound_holds", text, worst, None, 1, True)


def rise_headline(rates: list[dict[str, Any]]) -> dict[str, Any]:
    """g(H) at the highest monofact rate above g(H) at the lowest, by disjoint intervals."""
    low, high = rates[0], rates[-1]
    diff = high["hallucination_rate"] - low["hallucination_rate"]
    text = (
        f"The hallucination rate rises from {low['hallucination_rate']:.3f} at MF = {low['monofact_rate']:.2f} to "
        f"{high['hallucination_rate']:.3f} at MF = {high['monofact_rate']:.2f}."
    )
    ok = high["hallucination_rate_interval"][0] > low["hallucination_rate_interval"][1]
    why = "the 95% intervals of g(H) at the lowest and highest monofact rates overlap (or are in the other order)"
    return headline("hallucination_rises_with_mf", text, diff, None, 1 if diff > 0 else -1, ok, why)


def real_headlines(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The real track's headlines, from its results: the pretrained model on invented persons, the bound at every
    rate, and g(H) against MF; the full bound's vacuity stated as a headline the run cannot support."""
    before = results["pretrained"]
    rates = sorted(results["rates"], key=lambda r: r["monofact_rate"])
    share = before["chat_share"]
    text = (
        f"Before fine-tuning, asked where an invented person was born, the model {before['verdict']} "
        f"({share['abstain']:.0%} abstain, {share['city'] + share['asserts']:.0%} answer as if the person were real)."
    )
    out = [
        headline(
            "pretrained_on_invented_persons",
            text,
            share["abstain"],
            None,
            before["verdict"],
            before["verdict"] != "mixed",
            "as many replies abstain as answer",
        )
    ]
    out.append(bound_headline(rates))
    out.append(rise_headline(rates))
    best = max(r["bound_full_rhs"] for r in rates)
    out.append(
        headline(
            "full_bound",
            "The full Kalai–Vempala bound at δ = 0.1 constrains the hallucination rate.",
            best,
            None,
            0,
            best > 0,
            f"bound vacuous: with 16 cities |F|/|H| = 1/15 makes 3e^(−s)/δ = 2, and its right side is at most "
            f"{best:+.3f}, so it holds whatever the model does",
        )
    )
    return out


# --------------------------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------------------------
def toy_citation() -> dict[str, Any]:
    """The zoo-sized facts model beside the real one: the newest toy run of this experiment, cited (its MF and
    g(H) at each γ's held-out optimum), not re-measured; None where there is no finished toy run."""
    from lab.runs import latest_run, read_results

    folder = latest_run("hallucination")
    try:
        toy = read_results(folder) if folder is not None else None
    except (FileNotFoundError, ValueError):
        toy = None
    if toy is None:
        return {"run": None, "note": "no finished toy run: `forma run hallucination` makes one"}
    rows = []
    for s in toy.get("sweep", []):
        best = next((c for c in s["checkpoints"] if c.get("checkpoint") == "optimum"), None)
        if best is not None:
            rows.append({"gamma": s["gamma"], "monofact_rate": s["monofact_rate"], **_toy_row(best)})
    try:
        quick = bool(read_json(folder / "config.json").get("quick", False))
    except (FileNotFoundError, ValueError, AttributeError):
        quick = None
    return {"run": f"runs/hallucination/{folder.name}", "quick": quick, "sweep": rows}


def _toy_row(c: dict[str, Any]) -> dict[str, Any]:
    return {
        "hallucination_rate": c["hallucination_rate"],
        "miscalibration": c["miscalibration_tv_eps"],
        "bound": c["bound_rhs_delta_0_1"] + c["bound_slack_delta_0_1"],  # MF − Mis: the right side before slack
    }


def _rate(model: Any, corpus: Corpus, size: RealProfile, seed: int, folder: Path, start: dict[str, Any]) -> dict:
    """One monofact rate, measured once: read back from measured.json when an earlier attempt finished it, else
    fine-tuned from the pretrained weights (`start`), read on every person, measured, written, and its checkpoint
    removed."""
    from lab.train.checkpoint import CHECKPOINT_DIR, remove_checkpoints

    done = folder / "measured.json"
    if done.is_file():
        return read_json(done)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name in start:
                p.copy_(start[name])
    training = finetune(model, corpus, size, seed, folder)
    began = time.perf_counter()
    cities = city_ids(model.tokenizer)
    people = range(len(corpus.names))
    probs, greedy = read_prompts(model, [corpus.prompt(i) for i in people], cities)
    measured = measure_rate(
        corpus.p,
        probs,
        np.array(corpus.cities),
        corpus.kind,
        greedy,
        corpus.monofact_rate,
        corpus.n_train,
        size.n_boot,
        seed,
    )
    measured |= {"training": training, "measure_s": time.perf_counter() - began, "n_persons": len(corpus.names)}
    write_json(done, measured)
    remove_checkpoints(folder / CHECKPOINT_DIR)
    return measured


def run_real(cfg: Config, out: Path) -> dict[str, Any]:
    """The real-model track into `out`: the pretrained model on invented persons, then each monofact rate's
    fine-tuning and measurements; results.json's dict."""
    from lab.configs import torch_threads
    from lab.model.transformer import HookedTransformer

    size = cfg.real_profile
    load = os.getloadavg()[0]
    started = time.perf_counter()
    timing: dict[str, float] = {}
    with torch_threads(REAL_THREADS):
        model = HookedTransformer.from_pretrained(cfg.model).eval()
        timing["load_s"] = time.perf_counter() - started
        forbidden = question_words()
        corpora = [build_corpus(size.n_train, r, size.repeats, size.n_heldout, cfg.seed, forbidden) for r in size.rates]
        path = out / "pretrained.json"
        if not path.is_file():
            began = time.perf_counter()
            write_json(path, pretrained_behaviour(model, corpora[0], city_ids(model.tokenizer), size.n_chat))
            timing["pretrained_s"] = time.perf_counter() - began
        pretrained = read_json(path)
        names = trainable(model, size.trained_blocks)
        start = {n: p.detach().clone() for n, p in model.named_parameters() if n in set(names)}
        rates = []
        for corpus in corpora:
            folder = out / "finetune" / f"mf-{corpus.monofact_rate:.4f}"
            rates.append(_rate(model, corpus, size, cfg.seed, folder, start))
    timing["total_s"] = time.perf_counter() - started
    usage = resource.getrusage(resource.RUSAGE_SELF)
    results = {
        "real_track": True,
        "model": cfg.model,
        "model_label": LABEL,
        "corpus": CORPUS_LABEL,
        "sizes": {k: getattr(size, k) for k in size.__dataclass_fields__},
        "trained": {
            "blocks": [model.cfg.n_layers - size.trained_blocks, model.cfg.n_layers - 1],
            "n_parameters": int(sum(start[n].numel() for n in start)),
            "n_parameters_total": int(sum(p.numel() for p in model.parameters())),
            "what": f"the last {size.trained_blocks} of {model.cfg.n_layers} blocks (attention, MLP, norms); "
            "embeddings, unembedding, other blocks and the final norm frozen; loss on the city token",
        },
        "cities": list(CITIES),
        "pretrained": pretrained,
        "rates": rates,
        "toy": toy_citation(),
        "timing": timing,
        "peak_rss_gb": peak_rss_gb(),
        # The wall time depends on what else the cores run: the process's CPU time and the load it started under
        # say how busy they were.
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "load_average_1min_at_start": load,
    }
    results["headlines"] = real_headlines(results)
    return results
