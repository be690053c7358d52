"""Every field of every config is checked against its annotation: a string is never taken for a bool,
a bool never for an int, and a float field holds a finite number."""

import dataclasses
import math
from typing import Literal

import pytest

import experiments
from lab.configs import check_fields
from lab.data.facts import FactWorldConfig
from lab.model.config import ModelConfig
from lab.model.encoder_decoder import EncoderDecoderConfig
from lab.train.config import TrainConfig

MODEL = dict(d_vocab=10, d_model=8, n_layers=1, n_heads=2, n_ctx=8)
ENCODER_DECODER = dict(
    d_vocab_src=10, d_vocab_tgt=10, d_model=8, n_heads=2, n_encoder_layers=1, n_decoder_layers=1, n_ctx=8
)


@dataclasses.dataclass
class Every:
    """One field of every annotation kind check_fields reads."""

    flag: bool = False
    count: int = 1
    rate: float = 0.5
    name: str = "a"
    kind: Literal["x", "y"] = "x"
    rates: tuple[float, ...] = (1.0,)
    pair: tuple[int, str] = (1, "a")
    maybe: str | None = None

    def __post_init__(self) -> None:
        check_fields(self)


@pytest.mark.parametrize(
    "field, value, expected",
    [
        ("flag", "false", "bool"),
        ("flag", 0, "bool"),
        ("count", True, "int"),
        ("count", 2.0, "int"),
        ("count", "3", "int"),
        ("rate", "0.5", "float"),
        ("rate", True, "float"),
        ("rate", math.inf, "finite"),
        ("rate", math.nan, "finite"),
        ("rate", 10**400, "finite"),
        ("name", 3, "str"),
        ("kind", "z", "'x', 'y'"),
        ("rates", 1.0, "tuple"),
        ("rates", (1.0, "2"), "float"),
        ("rates", (math.nan,), "finite"),
        ("pair", (1,), "2 elements"),
        ("pair", (1, 2), "str"),
        ("maybe", 3, "str or None"),
    ],
)
def test_a_value_of_the_wrong_type_names_class_field_type_and_value(field, value, expected):
    with pytest.raises(ValueError) as err:
        Every(**{field: value})
    message = str(err.value)
    assert f"Every.{field}" in message and expected in message and repr(value)[:20] in message


def test_what_json_and_toml_cannot_say_is_normalised():
    every = Every(rate=1, rates=[2, 3.5], pair=[4, "b"], maybe="m")
    assert every.rate == 1.0 and isinstance(every.rate, float)
    assert every.rates == (2.0, 3.5) and all(isinstance(r, float) for r in every.rates)
    assert every.pair == (4, "b") and every.maybe == "m"
    assert Every(maybe=None).maybe is None


@pytest.mark.parametrize(
    "field, value",
    [
        ("bias", "false"),
        ("tied_embeddings", "false"),
        ("rotary_base", "1e4"),
        ("init_std", math.inf),
        ("norm_eps", math.inf),
        ("norm_eps", math.nan),
        ("n_layers", True),
        ("n_ctx", 8.0),
        ("positions", "rope"),
        ("tokenizer", None),
    ],
)
def test_model_config_refuses_a_mistyped_field(field, value):
    with pytest.raises(ValueError, match=f"ModelConfig.{field}"):
        ModelConfig(**(MODEL | {field: value}))


def test_model_config_from_toml_and_json_refuses_a_string_for_a_bool():
    toml = ModelConfig(**MODEL).to_toml().replace("bias = true", 'bias = "false"')
    with pytest.raises(ValueError, match=r"ModelConfig.bias must be a bool.*'false'"):
        ModelConfig.from_toml(toml)
    json_text = ModelConfig(**MODEL).to_json().replace('"tied_embeddings": false', '"tied_embeddings": "false"')
    with pytest.raises(ValueError, match="ModelConfig.tied_embeddings"):
        ModelConfig.from_json(json_text)


def test_an_int_in_a_float_field_saves_as_a_float():
    cfg = ModelConfig(**MODEL, rotary_base=10000)
    assert isinstance(cfg.rotary_base, float) and cfg == ModelConfig(**MODEL)


@pytest.mark.parametrize(
    "field, value", [("bias", "false"), ("norm_eps", math.inf), ("n_heads", 2.0), ("positions", "rotary")]
)
def test_encoder_decoder_config_refuses_a_mistyped_field(field, value):
    with pytest.raises(ValueError, match=f"EncoderDecoderConfig.{field}"):
        EncoderDecoderConfig(**(ENCODER_DECODER | {field: value}))


@pytest.mark.parametrize(
    "field, value", [("lr", math.nan), ("lr", "1e-3"), ("steps", True), ("device", 0), ("seed", 1.5)]
)
def test_train_config_refuses_a_mistyped_field(field, value):
    with pytest.raises(ValueError, match=f"TrainConfig.{field}"):
        TrainConfig(**{field: value})


@pytest.mark.parametrize(
    "field, value",
    [
        ("attributes", "birthday"),
        ("attributes", ("birthday", 3)),
        ("pareto_gamma", math.inf),
        ("seed", True),
        ("n_values", 2.0),
    ],
)
def test_fact_world_config_refuses_a_mistyped_field(field, value):
    with pytest.raises(ValueError, match=f"FactWorldConfig.{field}"):
        FactWorldConfig(**{field: value})


@pytest.mark.parametrize("name", experiments.experiment_names())
def test_every_experiment_config_checks_its_fields(name):
    config = experiments.load(name).Config
    for field, value in (("quick", "false"), ("seed", True), ("seed", 1.0)):
        with pytest.raises(ValueError, match=f"Config.{field}"):
            config(**{field: value})
    floats = [f.name for f in dataclasses.fields(config) if f.type is float]
    for field in floats:
        with pytest.raises(ValueError, match=f"Config.{field} must be a finite"):
            config(**{field: math.nan})


def test_the_quick_profile_sets_only_the_fields_left_at_the_default_profiles_values():
    """A ProfileConfig whose profiles are its fields (FIELDS): quick takes QUICK's value for each field still at
    DEFAULT's, the real-model pair's too; a value the caller gave stays, and so does a field no profile names."""
    import dataclasses

    from experiments import ProfileConfig

    @dataclasses.dataclass(frozen=True)
    class Profile:
        steps: int
        width: int

    @dataclasses.dataclass(frozen=True)
    class RealProfile:
        questions: int

    @dataclasses.dataclass
    class Chosen(ProfileConfig):
        PROFILES = (Profile(steps=1000, width=64), Profile(steps=10, width=8))
        REAL_PROFILES = (RealProfile(questions=300), RealProfile(questions=120))
        FIELDS = (True, True)

        steps: int = 1000
        width: int = 64
        questions: int = 300
        depth: int = 4

    chosen = Chosen(quick=True, width=32, depth=2)
    assert (chosen.steps, chosen.width, chosen.questions, chosen.depth, chosen.seed) == (10, 32, 120, 2, 0)
    assert (Chosen().steps, Chosen().width, Chosen().questions) == (1000, 64, 300)
    assert Chosen(quick=True).profile == Profile(steps=10, width=8)
    assert Chosen(quick=True).real_profile == RealProfile(questions=120)
    with pytest.raises(ValueError, match="seed must be a non-negative integer"):
        Chosen(seed=-1)


def test_a_failed_condition_is_a_value_error_that_names_the_config_class():
    from lab.configs import need

    need(Every(), True, "never raised")
    with pytest.raises(ValueError, match=r"^Every: count must be positive, got 0$"):
        need(Every(), False, "count must be positive, got 0")
    for build, words in (
        (lambda: FactWorldConfig(n_persons=0), "FactWorldConfig: n_persons must be a positive"),
        (lambda: experiments.load("calibration").Config(n_stages=1), "Config: need n_stages ≥ 2"),
        (lambda: experiments.load("monitor").Config(qa_folds=1), "Config: qa_folds must be at least"),
    ):
        with pytest.raises(ValueError, match=f"^{words}"):
            build()
