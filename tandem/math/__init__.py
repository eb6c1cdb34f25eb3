"""The math of speculative decoding: pure functions, no I/O, no models, randomness passed in.

- `params`: what temperature, top-k, top-p and the seed mean (`SamplingParams`);
- `rng`: counter-based uniforms keyed by (seed, position, purpose);
- `acceptance`: the orchestrator's half of a cycle, the accept test and the cycle's output;
- `analytic`: the expected tokens per target pass and the speedup they buy;
- `fit`: a pass's cost against its tokens, a decayed least-squares line;
- `sampling`: the workers' half, on tensors: warping, drawing, verifying a block (torch);
- `block`: the verifier's half of block verification, accepting a block's prefix jointly (torch);
- `tree`: token trees, their masks, and the walk down a tree that accepts a path;
- `tree_sampling`: the verifier's half of a sampled tree, recursive rejection sampling (torch).

Everything here but `sampling`, `block` and `tree_sampling` is plain Python, so the SDK and the orchestrator never load
torch. Nothing here imports the rest of tandem.
"""
