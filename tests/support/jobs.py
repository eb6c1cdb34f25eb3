"""A worker's job (tandem.services: a generator of the steps it asks its runtime for) run alone:
the unbatched reference that batched passes must answer like."""

from tandem.services import sampler
from tandem.services.runtime import KeepPath, ModelRuntime


def run_alone(runtime: ModelRuntime, job):
    """A job driven one step at a time, each in a pass and a round of asks of its own: the
    unbatched reference."""
    try:
        step = next(job)
        while True:
            if isinstance(step, KeepPath):
                step = job.send(runtime.keep_paths([step])[0])
                continue
            result = runtime.extend_batch([step])[0]
            if isinstance(result, Exception):
                step = job.throw(result)
            else:
                step = job.send(sampler.answer([step.ask], [result])[0] if step.ask else result)
    except StopIteration as done:
        return done.value
