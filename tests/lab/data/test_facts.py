"""The arbitrary-fact world: determinism, Good–Turing quantities, factoid counts, quizzes, splits."""

from collections import Counter

import numpy as np
import pytest

from lab.data.facts import SPECIAL_TOKENS, Fact, FactWorld, FactWorldConfig


@pytest.fixture(scope="module")
def small_cfg() -> FactWorldConfig:
    return FactWorldConfig(
        n_first_names=20,
        n_last_names=25,
        n_persons=120,
        attributes=("birthday", "city", "color"),
        pareto_gamma=1.2,
        n_train=400,
        seed=7,
        n_values=30,
    )


@pytest.fixture(scope="module")
def world(small_cfg: FactWorldConfig) -> FactWorld:
    return FactWorld(small_cfg)


def test_world_is_deterministic_under_seed(small_cfg: FactWorldConfig, world: FactWorld) -> None:
    again = FactWorld(small_cfg)
    assert again.persons == world.persons
    assert again.facts == world.facts
    np.testing.assert_array_equal(again.train_fact_indices, world.train_fact_indices)
    assert again.documents("template", seed=3) == world.documents("template", seed=3)
    other = FactWorld(FactWorldConfig(**{**small_cfg.to_dict(), "seed": 8}))
    assert other.facts != world.facts


def test_changing_n_train_keeps_the_facts(small_cfg: FactWorldConfig, world: FactWorld) -> None:
    bigger = FactWorld(FactWorldConfig(**{**small_cfg.to_dict(), "n_train": 900}))
    assert bigger.facts == world.facts
    np.testing.assert_array_equal(bigger.p, world.p)


def test_monofact_rate_by_hand(world: FactWorld) -> None:
    # Count training documents whose exact string occurs once: each fact has one bare string.
    docs = world.documents("bare")
    counts = Counter(docs)
    by_hand = sum(1 for doc in docs if counts[doc] == 1) / len(docs)
    assert world.monofact_rate() == pytest.approx(by_hand)
    assert world.train_counts.sum() == world.cfg.n_train


def test_monofact_rate_on_a_hand_built_sample(world: FactWorld) -> None:
    # Facts 0, 1, 1, 2, 2, 2, 3: facts 0 and 3 are singletons → MF = 2/7.
    counts = np.bincount([0, 1, 1, 2, 2, 2, 3], minlength=len(world.facts))
    assert (counts == 1).sum() / 7 == pytest.approx(2 / 7)
    assert (counts == 1).sum() == 2


def test_missing_mass_is_one_minus_seen_mass(world: FactWorld) -> None:
    missing = world.true_missing_mass()
    assert 0.0 <= missing <= 1.0
    seen = np.unique(world.train_fact_indices)
    assert missing == pytest.approx(1.0 - world.p[seen].sum())
    assert world.p.sum() == pytest.approx(1.0)
    assert np.all(world.popularity >= 1) and np.all(world.popularity == np.floor(world.popularity))


def test_monofact_rate_estimates_missing_mass_good_turing() -> None:
    cfg = FactWorldConfig(
        n_first_names=150, n_last_names=150, n_persons=20_000, pareto_gamma=1.5, n_train=20_000, seed=1
    )
    big = FactWorld(cfg)
    assert 0.05 < big.monofact_rate() < 0.95  # a regime where the estimate is informative
    assert big.monofact_rate() == pytest.approx(big.true_missing_mass(), abs=0.02)


def test_names_have_two_parts_and_persons_are_unique(world: FactWorld) -> None:
    assert len(set(world.persons)) == len(world.persons) == world.cfg.n_persons
    for person in world.persons:
        assert len(person.name.split()) == 2
        assert person.first in world.first_names and person.last in world.last_names
    assert len(world.first_names) == world.cfg.n_first_names
    assert world.first_names == sorted(set(world.first_names))
    assert all(" " not in name for name in world.first_names + world.last_names)


def test_facts_are_factoids_and_counts_add_up(world: FactWorld) -> None:
    factoids = list(world.enumerate_factoids())
    assert len(factoids) == len(set(factoids)) == world.n_factoids
    assert set(world.facts) <= set(factoids)
    assert len(world.facts) + world.n_hallucinations == world.n_factoids
    assert sum(world.is_true(*f) for f in factoids) == len(world.facts)
    assert world.n_factoids_all_names >= world.n_factoids
    assert len(world.value_spaces["birthday"]) == 12 * 28


def test_is_true_judges_against_the_world(world: FactWorld) -> None:
    fact = world.facts[5]
    person = world.persons[fact.person_index]
    assert world.is_true(fact.person_index, fact.attribute, fact.value)
    assert world.is_true(person.name, fact.attribute, fact.value)
    assert world.is_true((person.first, person.last), fact.attribute, fact.value)
    wrong = next(v for v in world.value_spaces[fact.attribute] if v != fact.value)
    assert not world.is_true(fact.person_index, fact.attribute, wrong)
    assert world.classify_bare(world.render(fact)) == "fact"
    assert world.classify_bare(world.render(Fact(fact.person_index, fact.attribute, wrong))) == "hallucination"
    assert world.classify_bare("Nobody Atall birthday May 3 .") == "malformed"
    assert world.classify_bare(f"{person.name} birthday Smarch 40 .") == "malformed"


def test_documents_render_training_facts(world: FactWorld) -> None:
    bare = world.documents("bare")
    assert len(bare) == world.cfg.n_train
    assert all(world.classify_bare(doc) == "fact" for doc in bare)
    vocab = set(world.word_vocabulary())
    templated = world.documents("template", seed=1)
    assert len({doc.split()[0] for doc in templated}) > 1  # several templates in use
    for doc in bare + templated:
        assert set(doc.split()) <= vocab


def test_quiz_items_have_one_correct_distinct_option(world: FactWorld) -> None:
    items = world.quiz_items(range(30), n_options=4, seed=2)
    assert len(items) == 30 * len(world.cfg.attributes)
    vocab = set(world.word_vocabulary())
    positions = Counter()
    for item in items:
        options = item["options"]
        assert len(options) == 4 and len(set(options)) == 4
        correct = [world.is_true(item["person"], item["attribute"], v) for v in options]
        assert sum(correct) == 1 and correct[item["answer_index"]]
        assert set(world.quiz_prompt(item).split()) <= vocab
        positions[item["answer_index"]] += 1
    assert len(positions) == 4  # the answer is not always in the same slot


def test_true_false_claims_are_labelled_correctly(world: FactWorld) -> None:
    claims = world.true_false_claims(range(10), seed=0)
    assert len(claims) == 2 * 10 * len(world.cfg.attributes)
    assert sum(label for _, label in claims) == len(claims) // 2
    texts = {world.render(f, "template") for f in world.facts}
    for text, label in claims:
        assert (text in texts) == label


def test_splits_are_entity_disjoint(world: FactWorld) -> None:
    splits = world.split_persons([0.6, 0.3, 0.1], seed=0)
    assert [len(s) for s in splits] == [72, 36, 12]
    union = np.concatenate(splits)
    assert len(union) == len(set(union.tolist())) == world.cfg.n_persons
    names = [{world.persons[i].name for i in s} for s in splits]
    assert not (names[0] & names[1] or names[0] & names[2] or names[1] & names[2])
    with pytest.raises(ValueError, match="fractions"):
        world.split_persons([0.8, 0.5])


def test_word_vocabulary_has_specials_first(world: FactWorld) -> None:
    vocab = world.word_vocabulary()
    assert tuple(vocab[:4]) == SPECIAL_TOKENS
    assert len(vocab) == len(set(vocab))
    assert vocab[4:] == sorted(vocab[4:])


def test_config_round_trips(small_cfg: FactWorldConfig) -> None:
    assert FactWorldConfig.from_dict(small_cfg.to_dict()) == small_cfg
    with pytest.raises(ValueError, match="unknown keys"):
        FactWorldConfig.from_dict({**small_cfg.to_dict(), "gamma": 1.0})


@pytest.mark.parametrize(
    "changes,field",
    [
        ({"pareto_gamma": 0.0}, "pareto_gamma"),
        ({"pareto_gamma": -1.0}, "pareto_gamma"),
        ({"n_persons": 26, "n_first_names": 5, "n_last_names": 5}, "n_persons"),
        ({"n_train": 0}, "n_train"),
        ({"n_first_names": 0}, "n_first_names"),
        ({"attributes": ()}, "attributes"),
        ({"attributes": ("birthday", "birthday")}, "attributes"),
        ({"attributes": ("Birth Day",)}, "attributes"),
        ({"seed": -1}, "seed"),
        ({"n_values": 1}, "n_values"),
    ],
)
def test_invalid_config_names_the_field(changes: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        FactWorldConfig(**changes)


def test_too_many_names_for_faker_pool_is_an_error() -> None:
    with pytest.raises(ValueError, match="n_first_names"):
        FactWorld(FactWorldConfig(n_first_names=5000, n_last_names=2, n_persons=10))


def test_heldout_draws_are_fresh_iid_draws_not_training_examples(small_cfg: FactWorldConfig, world: FactWorld) -> None:
    held = world.heldout_fact_indices(400)
    assert held.shape == (400,) and held.min() >= 0 and held.max() < len(world.facts)
    np.testing.assert_array_equal(held, FactWorld(small_cfg).heldout_fact_indices(400))  # deterministic
    # Their own stream: the training sample (and so n_train) does not move them.
    bigger = FactWorld(FactWorldConfig(**{**small_cfg.to_dict(), "n_train": small_cfg.n_train * 2}))
    np.testing.assert_array_equal(held, bigger.heldout_fact_indices(400))
    assert not np.array_equal(held, world.train_fact_indices[:400])
    # i.i.d. from p: the popular facts come up as often as p says (a loose 5-sigma band on the top fact).
    top = int(np.argmax(world.p))
    many = world.heldout_fact_indices(20000)
    share = float((many == top).mean())
    assert abs(share - world.p[top]) <= 5 * np.sqrt(world.p[top] * (1 - world.p[top]) / 20000)
    overlap = world.heldout_overlap(held)
    seen = world.train_counts > 0
    assert overlap["draws"] == 400 and overlap["draws_of_facts_in_training"] == int(seen[held].sum())
    assert overlap["distinct_facts"] == len(set(held.tolist())) >= overlap["distinct_facts_in_training"]
    with pytest.raises(ValueError, match="positive integer"):
        world.heldout_fact_indices(0)


def test_a_cloze_is_its_statement_cut_before_the_value_with_the_name_where_it_says() -> None:
    world = FactWorld(
        FactWorldConfig(n_first_names=10, n_last_names=10, n_persons=20, attributes=("city", "team"), n_train=50)
    )
    for fact in world.facts:
        for template in range(3):
            cloze = world.cloze(fact, template)
            person = world.persons[fact.person_index]
            assert " ".join(cloze.words + [cloze.value, "."]) == world.render(fact, "template", template)
            assert [cloze.words[i] for i in cloze.name_positions] == [person.first, person.last]
            assert cloze.value == fact.value
