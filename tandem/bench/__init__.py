"""The benchmark harness behind `tandem bench`: the cluster in every γ mode against Hugging Face
`generate` with the target alone and with `assistant_model=` the draft, interleaved prompt by
prompt in one run, with the cost of every part of a cycle.

- `runs`: one generation of one mode, timed token by token (HF in-process, or the cluster);
- `summary`: pure statistics over runs (speedups, acceptance, analytic bound, time split);
- `report`: the markdown tables and PNG plots;
- `harness`: the run plan (warm-up, interleaving, concurrency, memory) and the outputs;
- `tracing_cost`, `otlp`: what tracing costs, measured against a real OTLP receiver;
- `corpus`: where the code comes from: the standard library the shipped pair trains on,
  third-party code the held-out prompts come from, and the prompt files read back.
"""
