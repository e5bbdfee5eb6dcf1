"""RoPE configurations every kernel test runs against."""

from lazyattn.kernels.rope import RopeConfig, RopeTables

ROPE_CASES = {
    "default": dict(base=10000.0),
    "linear": dict(base=10000.0, rope_type="linear", factor=4.0),
    "llama3": dict(
        base=500000.0,
        rope_type="llama3",
        factor=8.0,
        low_freq_factor=1.0,
        high_freq_factor=4.0,
        original_max_position=64,
    ),
    "ntk": dict(base=10000.0, rope_type="ntk", factor=2.0),
    "yarn": dict(base=10000.0, rope_type="yarn", factor=4.0, original_max_position=64),
    "interleaved": dict(base=10000.0, interleaved=True),
}


def tables(name: str, head_dim: int, max_position: int = 4096, device="cpu") -> RopeTables:
    return RopeTables.build(RopeConfig(head_dim=head_dim, **ROPE_CASES[name]), max_position, device)
