"""The ported suite's promises, checked against this run (collected last, after every ported test):

- every upstream test that passes on TransformerLens's HookedTransformer passes on Forma's, but the gaps listed in
  expected.py (FORMA_GAPS), which fail on Forma alone;
- docs/measured/transformer_lens.json, which docs/ecosystem.md and README.md quote, is this run's table (the
  session's end writes it after a run of the whole folder: a difference is a table to commit);
- each ported file's header names its upstream file and the commit it is taken from.
"""

import json

from tests.transformer_lens.run_record import HERE, TABLE, complete, outcomes, table
from tests.transformer_lens.expected import FORMA_GAPS, PORTED, UPSTREAM


def test_the_run_covers_every_ported_file(request):
    assert complete(request.config), ("run the whole folder (pytest tests/transformer_lens, as make test-sae "
                                      "does): the table is a run of every ported test on both implementations")


def test_every_test_that_passes_on_the_reference_passes_on_forma():
    results = outcomes()
    fails = sorted(f"{file}::{test}" for (file, impl, test), passed in results.items()
                   if impl == "reference" and passed and not results.get((file, "forma", test)))
    assert fails == sorted(FORMA_GAPS), fails
    for gap in FORMA_GAPS:  # each gap a real one: it passes on the reference
        file, test = gap.split("::", 1)
        assert results[(file, "reference", test)], gap


def test_the_table_in_the_docs_is_this_runs():
    recorded = json.loads(TABLE.read_text())
    assert recorded == json.loads(json.dumps(table(outcomes()))), (
        f"{TABLE} is not this run's table; the end of this session rewrites it: commit it")


def test_every_ported_file_names_its_upstream_file_and_commit():
    for file in PORTED:
        upstream, commit = UPSTREAM[file]
        header = (HERE / file).read_text().split("\n", 4)[:4]
        assert f"Ported from TransformerLens: {upstream}," in header[0], file
        assert (commit or "in no commit") in " ".join(header), file
