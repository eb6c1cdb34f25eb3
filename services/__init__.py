"""tandem's gRPC workers: the draft worker and the target verifier, over one model runtime."""
