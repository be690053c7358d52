"""Stream hook activations over a dataset, keeping only the positions asked for.

`run_with_cache` holds every position of every cached hook for one batch. Over a dataset that does
not fit: 10,000 sequences × 128 tokens × d_model 192 of one layer is ~1 GB in float32, and most
analyses need a few positions per sequence (the last token, an answer slot). So each batch runs with
a hook on only the chosen activations (`names_filter`-style: nothing else is cached) that slices the
selected positions out *at capture time*; the full [batch, pos, ...] activation is dropped with the
forward pass. Once every chosen hook has fired the forward pass stops (nothing after the deepest
chosen layer is computed, not even the logits).

Positions are chosen per sequence by
    "last"                 the final position (the last non-padding one when `pad_id` is given)
    "all"                  every position
    [i, j, ...]            fixed indices (negative ones count from the end)
    predicate(tokens)      a function of the [batch, pos] token ids returning a bool mask, e.g.
                           `lambda t: t == sep_id`: every position where it is True

Results are rows: `acts[name]` is [rows, *shape] (shape is the activation's without batch and
position, e.g. [d_model] or [head, d_head]), with `seq[r]` (index of the row's sequence in the dataset)
and `pos[r]` (its position). Rows are ordered by sequence, then position.

    collect_activations(...) -> Activations          everything in memory
    save_activations(..., out_dir) -> ActivationStore   safetensors shards + index.json on disk;
                                                     memory held: one batch plus one shard buffer
    stream_activations(...)                          the generator both use: one Activations per batch

On disk, `out_dir/shard-00000.safetensors ...` hold each hook's rows plus `seq` and `pos`, and
`out_dir/index.json` (written last, so its presence means the set is complete) lists the shards,
each hook's per-row shape and dtype, and what was collected. Every shard is written atomically and
then recorded in `out_dir/progress.json` (also atomic), so a harvest that is killed or raises can be
rerun with the same arguments: it checks that the arguments and the token ids of the sequences already
done are the same, and continues after the last recorded shard — the finished set is bitwise the one
an uninterrupted harvest writes. A shard never recorded (or a temporary a kill left) is deleted, never
listed.

The modules: `collect` (Activations, select_positions, stream_activations, collect_activations), `store`
(save_activations, ActivationStore, StoredRows, merge_stores) and `harvest` (a corpus into one set, in one process
or across the ranks of torchrun: read_corpus, harvest).
"""
