"""How a run's headlines read (results.json "headlines", docs/experiments.md): the sentences the run supports, then
each claim it cannot support at its size, named in words, with the reason. `forma run NAME` prints them when
the run ends and every dashboard page shows them, in the same words. Standard library only."""

from typing import Any

from lab.names import NAMES

# A headline's name is a key ("p_ik_verdict_partial"); its title is that key in words.
WORDS = {
    "p_ik": "P(IK)",
    "p_true": "P(True)",
    "ece": "ECE",
    "nll": "NLL",
    "kl": "KL",
    "ltt": "LTT",
    "crc": "CRC",
    "auroc": "AUROC",
    "aurc": "AURC",
    "mf": "monofact rate",
    "rho": "ρ",
    "kv": "KV",
    "llama": "LLaMA",
    "7b": "7B",
    "alpha": "at α =",
    "delta": "at δ =",
    "gamma": "at γ =",
}
WHERE = {"end": "at the end of training", "partial": "at the partial checkpoint"}


def title(name: str) -> str:
    """A headline's name in words: `p_ik_verdict_partial` → "P(IK) verdict at the partial checkpoint",
    `max_prob_separates_seen` → "Top probability separates seen"."""
    parts = str(name).split("_")
    words: list[str] = []
    i = 0
    while i < len(parts):
        key = next((n for n in (4, 3, 2) if "_".join(parts[i : i + n]) in NAMES), 0)
        if key:  # a method, signal or grade: its one display name (lab.names)
            words.append(NAMES["_".join(parts[i : i + key])])
            i += key
            continue
        pair = "_".join(parts[i : i + 2])
        if pair in WORDS:
            words.append(WORDS[pair])
            i += 2
            continue
        part = parts[i]
        words.append(WHERE.get(part) if i == len(parts) - 1 and part in WHERE else WORDS.get(part, part))
        i += 1
    text = " ".join(w for w in words if w)
    return text[:1].upper() + text[1:]


def split(results: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]] | None:
    """(supported, unsupported) headline entries of a results.json; None when it has no headlines list."""
    entries = results.get("headlines")
    if not isinstance(entries, list):
        return None
    entries = [h for h in entries if isinstance(h, dict)]
    return [h for h in entries if h.get("supported")], [h for h in entries if not h.get("supported")]


def reason(entry: dict[str, Any]) -> str:
    """An unsupported headline as one line: its title, then why this run cannot support it."""
    return f"{title(entry.get('name', ''))}: {entry.get('why_not') or 'no reason recorded'}"


def lines(results: dict[str, Any]) -> list[str]:
    """The headlines as a terminal shows them: each supported sentence, then each claim this run cannot support."""
    parts = split(results)
    if parts is None:
        return ["This run wrote no headlines."]
    supported, unsupported = parts
    out = ["Headlines:"] + [f"  - {h.get('sentence')}" for h in supported]
    if unsupported:
        out += ["Not shown, because this run cannot support it:"] + [f"  - {reason(h)}" for h in unsupported]
    return out
