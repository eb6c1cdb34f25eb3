"""Counter-based randomness: every uniform is a pure function of (seed, position, purpose).

A replayed cycle draws the same numbers, so a session resumed from Redis continues exactly as
it would have, on any replica. Each pre-drawn token has its own purpose, so the numbers that
decide one event never correlate with those of another (the exactness argument needs that).

Nor may a later cycle read a number that an earlier cycle's outcome depended on. Block
verification's outcome depends on every drafted token of its block and every accept test
(tandem.math.block: τ is the largest passing position), past the tokens it outputs; the next
cycle drafts and tests those same positions again. So the draws and accept tests of a drafted
block, chain or tree, are keyed per cycle (`cycle_uniforms`: the cycle's first drafted position,
then the index in the block), and a later cycle never meets them. The verifier's pre-drawn
tokens are keyed by absolute position (`uniforms`): a cycle uses only the one at its outcome,
and every later cycle starts past it.
"""

from enum import IntEnum

_MASK = (1 << 64) - 1
PURPOSE_BITS = 3  # a key is position << PURPOSE_BITS | purpose: values 1 … 7 are taken
CYCLE_KEYS = 128  # keys per cycle: a chain's drafted tokens, a tree's n nodes and its n + 1 rows fit


class Purpose(IntEnum):
    """What a uniform is drawn for; part of its key."""

    DRAFT = 1  # the draft worker samples a chain's drafted token (keyed per cycle)
    ACCEPT = 2  # the orchestrator's accept test of a chain's drafted token (keyed per cycle)
    RECOVERED = 3  # the verifier samples the recovered token from the residual
    BONUS = 4  # the verifier samples the bonus token from the target
    # Token trees (tandem.math.tree), keyed per node by cycle_uniforms: a node's draw from its
    # parent's draft distribution, its accept test, and a row's residual (or leaf's bonus) draw.
    TREE_DRAFT = 5
    TREE_ACCEPT = 6
    TREE_RECOVERED = 7


def check_purposes(purposes: type[IntEnum]) -> None:
    """Refuse purposes that do not fit PURPOSE_BITS: one that did not would share keys with the
    next position's numbers of another purpose, silently. (A new purpose needs a wider field,
    which changes every key: every seeded output with it.)"""
    for p in purposes:
        if not 0 < p < 1 << PURPOSE_BITS:
            raise ValueError(f"purpose {p.name} = {int(p)} does not fit the key's {PURPOSE_BITS} purpose bits "
                             f"(1 … {(1 << PURPOSE_BITS) - 1})")


check_purposes(Purpose)


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def uniform(seed: int, position: int, purpose: Purpose) -> float:
    """A float64 in [0, 1) keyed by (seed, absolute token position, purpose)."""
    key = _splitmix64(_splitmix64(seed & _MASK) ^ (position << PURPOSE_BITS | int(purpose)))
    return (key >> 11) * 2.0**-53


def uniforms(seed: int, start: int, count: int, purpose: Purpose) -> list[float]:
    """Uniforms for positions start, start+1, ..., start+count-1."""
    return [uniform(seed, start + i, purpose) for i in range(count)]


def cycle_uniforms(seed: int, position: int, count: int, purpose: Purpose) -> list[float]:
    """Uniforms for the first `count` drafted tokens of a cycle (a chain's, or a token tree's
    nodes or rows) whose first drafted token sits at absolute position `position`: keys
    position · CYCLE_KEYS + i, disjoint from every other cycle's (each starts at another position)."""
    if count > CYCLE_KEYS:
        raise ValueError(f"a cycle has at most {CYCLE_KEYS} keys per purpose, asked for {count}")
    return [uniform(seed, position * CYCLE_KEYS + i, purpose) for i in range(count)]
