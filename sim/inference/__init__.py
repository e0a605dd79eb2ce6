"""The real numpy inference core: it runs small transformers to record activation traces.

Modules, lowest first: ``weights`` (configs, safetensors checkpoints, tiny random models),
``tokenizer`` (WordPiece, bytes), ``ffn`` (bundled dense/sparse FFN kernels, MoE routing),
``transformer`` (the forward pass with a KV cache), ``predictor`` (oracle and low-rank
predictors with measured quality), ``fetch`` (the explicit setup step that caches the real
all-MiniLM-L6-v2 checkpoint) and ``recorder`` (model + text -> trace file).

Nothing here is imported by ``import sim``: numba and the kernels load only when used.
"""
