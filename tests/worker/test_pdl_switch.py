"""The PDL switch of the Triton kernels (engine/pdl.py), without a GPU: KEMBED_PDL's values, and that a
forced PDL launch where it cannot run is refused with a clear error rather than launched as something else."""

import pytest
import torch

from kembed.worker.engine import pdl


@pytest.fixture
def fresh_switch():
    """KEMBED_PDL is read once per process; each case here reads it afresh and leaves no reading behind."""
    pdl.is_switched_on.cache_clear()
    yield
    pdl.is_switched_on.cache_clear()


@pytest.mark.parametrize(
    ("value", "is_on"), [(None, True), ("1", True), ("0", False)], ids=["unset", "1", "0"]
)
def test_pdl_switch_reads_0_as_off_and_1_or_unset_as_on(fresh_switch, monkeypatch, value, is_on):
    if value is None:
        monkeypatch.delenv(pdl.ENV_SWITCH, raising=False)
    else:
        monkeypatch.setenv(pdl.ENV_SWITCH, value)
    assert pdl.is_switched_on() is is_on


def test_pdl_switch_refuses_other_values(fresh_switch, monkeypatch):
    monkeypatch.setenv(pdl.ENV_SWITCH, "off")
    with pytest.raises(ValueError, match="KEMBED_PDL='off'"):
        pdl.is_switched_on()


def test_forced_pdl_where_unsupported_is_refused():
    cpu = torch.device("cpu")
    assert not pdl.is_supported(cpu)
    with pytest.raises(ValueError, match="does not support it"):
        pdl.launch_options(cpu, True)
    assert pdl.launch_options(cpu, False) == {"PDL": False}
