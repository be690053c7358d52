"""lab.distributed in one process: parts that never depend on the world size, shares that cover a list once, the
claim of what is done and what is left, the plan a rerun must match, and the gathers (the identity in a world of
one; with 2 gloo ranks they run under torchrun in tests/lab/cli/test_cli_datasets.py)."""

import json

import pytest
import torch

from lab.distributed import (
    PLAN_FILE,
    all_gather_json,
    all_gather_rows,
    claim_parts,
    plan_parts,
    rank_world,
    record_plan,
    share,
)


@pytest.mark.parametrize(
    "n, unit, most", [(0, 1, 256), (1, 4, 256), (50, 4, 256), (50, 4, 5), (1000, 1, 256), (1000, 32, 7), (257, 1, 256)]
)
def test_parts_cover_the_items_once_in_order_on_whole_units(n, unit, most):
    parts = plan_parts(n, unit=unit, most=most)
    assert [i for r in parts for i in r] == list(range(n))  # every item once, in order
    assert len(parts) == min(most, -(-n // unit))
    assert all(r.start % unit == 0 and len(r) > 0 for r in parts)  # no batch split, no empty part
    units = [-(-len(r) // unit) for r in parts]
    assert not units or max(units) - min(units) <= 1  # nearly equal, counted in units


@pytest.mark.parametrize("world", [1, 2, 3, 8])
@pytest.mark.parametrize("n", [0, 5, 13, 256])
def test_the_shares_of_the_ranks_cover_a_list_once_in_rank_order(n, world):
    items = list(range(n))
    shares = [list(share(items, rank, world)) for rank in range(world)]
    assert [i for s in shares for i in s] == items
    assert max(map(len, shares)) - min(map(len, shares)) <= 1
    with pytest.raises(ValueError, match="rank 3 out of range for a world of 3"):
        share(items, 3, 3)


def test_in_one_process_the_claim_keeps_what_is_done_and_takes_the_rest():
    assert rank_world() == (0, 1)
    assert claim_parts(6, lambda i: i in (1, 4)) == ([1, 4], [0, 2, 3, 5])
    assert claim_parts(0, lambda i: True) == ([], [])


def test_in_one_process_a_gather_returns_what_was_given():
    rows = torch.tensor([[1.0, float("nan")], [-0.0, 2.0]])
    assert torch.equal(all_gather_rows(rows).view(torch.int32), rows.view(torch.int32))  # the bits, NaN and -0.0
    assert all_gather_json({"a": [1, 2], "b": None}) == [{"a": [1, 2], "b": None}]
    assert all_gather_json({1: "keys become strings, as JSON has them"}) == [
        {"1": "keys become strings, as JSON has them"}
    ]


def test_a_plan_is_written_once_and_a_rerun_with_another_argument_names_it(tmp_path):
    plan = {"batch_size": 4, "hooks": ["blocks.0.hook_resid_post"], "dtype": None}
    record_plan(tmp_path / "job", plan, what="harvest")
    written = (tmp_path / "job" / PLAN_FILE).read_bytes()
    record_plan(tmp_path / "job", dict(plan), what="harvest")  # the same arguments: nothing changes
    assert (tmp_path / "job" / PLAN_FILE).read_bytes() == written
    with pytest.raises(ValueError, match=r"holds a harvest begun with other arguments \(batch_size: 4 then, 8 now\)"):
        record_plan(tmp_path / "job", plan | {"batch_size": 8}, what="harvest")
    with pytest.raises(ValueError, match=r"\(extra: None then, 1 now\)"):
        record_plan(tmp_path / "job", plan | {"extra": 1})
    record_plan(tmp_path / "job", plan | {"batch_size": 8}, overwrite=True)
    assert json.loads((tmp_path / "job" / PLAN_FILE).read_text())["batch_size"] == 8
    (tmp_path / "job" / PLAN_FILE).write_text("{not json")
    with pytest.raises(ValueError, match="malformed"):
        record_plan(tmp_path / "job", plan)
