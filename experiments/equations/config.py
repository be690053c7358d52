"""The equations experiment's Config and its two profiles."""

from dataclasses import dataclass

from experiments import ProfileConfig


@dataclass(frozen=True)
class Profile:
    """What the default and quick runs differ in: the Monte Carlo samples and the KV-cache timings."""

    samples: int  # Monte Carlo pairs: standard error of Var/d_k ≈ √(2/n)
    kv_prefixes: tuple[int, ...]  # the prefix lengths the KV cache's cost is timed at
    kv_repeats: int  # timings of each, the median kept


DEFAULT = Profile(samples=40000, kv_prefixes=(128, 256, 512, 1024), kv_repeats=9)
QUICK = Profile(samples=5000, kv_prefixes=(64, 128, 256), kv_repeats=3)


@dataclass
class Config(ProfileConfig):
    """The equations experiment: everything is seeded; `quick` shrinks the Monte Carlo samples and timings."""

    PROFILES = (DEFAULT, QUICK)
