"""Data with known ground truth: sources with exact conditionals, an arbitrary-fact world, and real
English from the Python standard library (see docs/definitions.md §1–§2)."""
