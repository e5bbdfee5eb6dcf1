"""Which kernel families launch with programmatic dependent launch (kernels/launch.py): the LAZYATTN_PDL forms and the
per-device defaults, checked by hand (no GPU needed: the choice is host logic)."""

import pytest
import torch

from lazyattn.envs import read_env
from lazyattn.errors import InvalidRequestError
from lazyattn.kernels import launch

ALL = frozenset(launch.PDL_FAMILIES)


@pytest.fixture(autouse=True)
def _fresh_env(kernel_settings):
    kernel_settings()  # LAZYATTN_PDL unset


def test_default_is_every_family_except_where_measured_slower():
    assert launch.pdl_families("NVIDIA H100 80GB HBM3") == ALL
    assert launch.pdl_families("some future GPU") == ALL
    # The H200 keeps PDL for everything but the skinny GEMMs (Session 16's measurements).
    assert launch.pdl_families("NVIDIA H200") == ALL - {"gemv"}


@pytest.mark.parametrize(
    "value, want",
    [
        ("auto", ALL - {"gemv"}),
        ("", ALL - {"gemv"}),
        ("1", ALL),
        ("0", frozenset()),
        ("attention", frozenset({"attention"})),
        (" Attention , rope, ", frozenset({"attention", "rope"})),
    ],
)
def test_environment_forms(kernel_settings, value, want):
    kernel_settings(LAZYATTN_PDL=value)
    assert launch.pdl_families("NVIDIA H200") == want


def test_unknown_family_is_named():
    with pytest.raises(InvalidRequestError, match="LAZYATTN_PDL='gemv,decoder': expected auto, 1, 0 or a comma-sep"):
        read_env({"LAZYATTN_PDL": "gemv,decoder"})


def test_never_on_a_cpu(kernel_settings):
    kernel_settings(LAZYATTN_PDL="1")
    assert launch.pdl_options(torch.device("cpu"), "gemv") == {"USE_PDL": False}
    assert launch.pdl_on(torch.device("cpu")) == []
