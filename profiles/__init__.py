"""Where numbers come from: profilers, reference profiles, scenario assembly.

Pure (no torch):
  models        ModelSpec, the presets, layer kinds and parameter counts
  rows          profile rows and the statistics behind them
  estimate      the reference efficiency model (datasheets -> estimated rows)
  reference/    bundled GPU catalogue, link defaults, estimated rows (package data)
  scenario      a full scenario document from a cluster file and rows
  upload        rows and links to the service through api.client

PyTorch (the `torch` extra; import only where needed):
  torch_layers  the layers, Megatron-style tensor parallel, deterministic init
  distributed   spawn N processes in one group, or join torchrun's
  tp_check      TP=n against TP=1 on outputs and gradients
  layer_profiler, link_profiler   the measurements

Importing this package never imports torch.
"""
