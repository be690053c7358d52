"""Speed and memory of Forma against Hugging Face and TransformerLens on identical weights."""
