"""Hugging Face transformers export and import of gptrain models.

`architectures` picks the transformers class for a GPTConfig (and back), `tensors` maps each
tensor's name and layout, `export` and `import_` stream the weights layer by layer, and
`verify` proves every conversion by comparing logits and a greedy continuation.
"""
