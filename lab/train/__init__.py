"""The training loop: one process or many under torchrun (DDP), resumable to the bit.

Reads top to bottom: `get_batch` (this rank's rows of a global batch that is a pure function of
(seed, split, step)), `estimate_loss` (mean held-out loss over fixed batches), `get_lr` (linear
warmup, then cosine to a floor), and `train`, one loop with evaluation, checkpointing and one log
line per eval interval (`lab.train.loop`). The loop serves both model classes: a `Batch` carries the decoder's tokens
and,
for an encoder–decoder, the source it reads, and the loss is always `summed_loss(model(*batch.inputs),
batch.targets)`. Everything a resumed run needs lives in the checkpoint folder (`lab.train.checkpoint`):

    out_dir/checkpoint/model.safetensors, config.json   the model (`HookedTransformer.save`)
                       optimizer.safetensors             AdamW moments and step counts
                       rng_state.safetensors             torch's RNG state(s) as uint8 tensors
                       train_state.json                  step, losses, TrainConfig, ModelConfig
    out_dir/metrics.jsonl                                one JSON line per step

A checkpoint is written into a temporary folder and renamed into place, so a crash leaves either
the previous checkpoint or the new one, never half of one. One is written every `checkpoint_interval`
steps and every `checkpoint_every_s` seconds of training, at the end, and when SIGINT or SIGTERM
arrives (the step in flight finishes, the checkpoint is written, then `TrainingInterrupted` is
raised). Because every batch is drawn from a generator seeded by (seed, split, step) and the
optimizer state is restored exactly, training 10 steps and resuming for 10 more gives the same
weights as 20 uninterrupted steps; when a checkpoint is taken does not change the trajectory.

Under torchrun each rank takes a contiguous slice of the same global batch and the loss is
normalised by the global number of scored targets, so the averaged DDP gradient equals the
single-process gradient on the whole batch: `batch_size` means the same thing at any world size.

The modules: `config` (TrainConfig), `batches` (Batch, the Batches protocol, TokenStream, SequenceBatches,
PairBatches), `checkpoint`, `loop` and `entry` (the command line below, `python -m lab.train`); the process
group (rank, world size, sums across ranks) is `lab.distributed`'s.

    python -m lab.train --demo-markov --steps 200 --out runs/train-demo
    python -m torch.distributed.run --standalone --nproc_per_node=2 -m lab.train --demo-markov --out DIR
"""
