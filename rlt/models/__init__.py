"""The model families and what describes a checkpoint: Ouro, Nanbeige4.2 and Huginn-0125 as stages
(base.py) that one code path runs for the dense reference, the paged engine and the GPU kernels;
their config.json schemas; ModelConfig, the one description of a checkpoint the coordinator and
the workers share. No torch at import for what the coordinator reads (model_config.py, configs.py,
family.py's table, json_object.py).

Modules:
  family.py         the one table of families: config schema, model class, tensor names,
                    tokenizer, checkpoint presets
  model_config.py   ModelConfig: config.json parsed once (family config + neutral facts such as
                    depth, vocab, eos ids, KV geometry); the dtype a model runs in
  configs.py        the three families' config.json schemas (config_reader.py: typed reads)
  base.py           the stage interface every family implements, and the attention it calls
  ouro.py, nanbeige.py, huginn.py   the families' stages
  layers.py         the layers' torch reference; ops.py: the kernel sets they run (reference,
                    Triton, batch-invariant Triton), one built per worker by its backend
  loader.py         safetensors loading, names and shapes checked against the official ones
  weights.py        the weights a pass reads (core layers, boundary layers, head): byte counts
  tokenizer.py      loading a checkpoint's tokenizer; training the small ones the checkpoint
                    maker ships
  checkpoint.py     `rlt make-checkpoint`: random-weight checkpoints in the official schemas
  default_model.py  the embedded default: a tiny Ouro checkpoint made on first use
  hub.py            a Hugging Face Hub id resolved to its snapshot
  json_object.py    reading a JSON object file (config.json, tokenizer files), errors naming it

ModelConfig is built once, by the entry point, from config.json after hf_overrides; the handshake
carries that dict to every worker, which rebuilds the same ModelConfig without reading the file.
"""
