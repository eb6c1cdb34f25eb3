"""tandem's orchestrator: the draft-verify cycle loop, the γ policy, sessions in Redis, and the
Ray Serve deployment that fronts them."""
