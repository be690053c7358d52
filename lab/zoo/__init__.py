"""The model zoo: `models/<name>/model.toml` is a recipe; `forma build NAME` builds its weights there.

A recipe has four tables:
    [world]   where the data comes from (kind = "markov" | "hmm" | "facts" | "pydoc" | "dates") and its parameters
    [model]   ModelConfig fields (d_vocab comes from the world); or kind = "encoder_decoder" and
              EncoderDecoderConfig fields (d_vocab_src, d_vocab_tgt from a translation world: "dates")
    [train]   TrainConfig fields
    [quick]   overrides for `--quick` (quick.world, quick.model, quick.train), for tests and the demo

Every key of every table is checked when the recipe is read: an unknown key is an error that names it
and the known ones, and so is a missing required one.

A built model folder holds model.safetensors, config.json, tokenizer.json, world.json (what the world
was, so experiments can recompute its true distribution), card.json (measured training time, losses,
and for pydoc the perplexities against n-gram baselines and sample generations), recipe.json (the
tables it was built from) and train/ (metrics, checkpoint). All of these are git-ignored; model.toml
and MODEL.md are the recipe and its card.

Builds. `forma build NAME` trains into a new folder models/NAME/.builds/<id>/, marked by the link
`.next`, while the previous model stays where it was; every name above is a link `NAME → .current/NAME`,
and `.current` links to the published build, so that one rename of `.current` publishes the new
model's files all at once (`lab.zoo.builds.publish_build`). Training checkpoints into the build's train/
folder, so an interrupted build — killed, Ctrl-C, SIGTERM — is continued by `forma build NAME --resume`
to the same bits an uninterrupted build gives.

The modules: `imports` (a pretrained model made from a file a package ships: smollm2),
`recipes` (load_recipe and the checks of every table), `worlds` (a recipe's world as tokens,
world_source), `cards` (what card.json measures), `builds` (build folders, resuming, publishing with one
rename) and `building` (build).
"""
