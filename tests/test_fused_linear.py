"""FusedLinear: the stacked projections compute what the separate nn.Linear layers compute, on each
of its CPU paths (one row through the [in, out] copy, several rows through the weight packed for oneDNN
where torch has it, else F.linear), eager and under torch.compile, and the layers' parameters stay
views of the fused weight (no second copy of the checkpoint's values)."""

import pytest
import torch
from torch import nn

from minirunner.model import cpu_linear
from minirunner.model.decoder import FusedLinear


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("rows", [1, 2, 7, 33])
def test_fused_projections_equal_the_separate_layers(bias, rows):
    torch.manual_seed(rows)
    layers = [nn.Linear(48, n, bias=bias) for n in (32, 16, 16)]
    x = torch.randn(rows, 48)
    with torch.no_grad():
        expected = torch.cat([m(x) for m in layers], dim=-1)
        fused = FusedLinear(layers)
        got = fused(x)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    # the layers still compute the same (their weights are now row views of the fused tensor)
    with torch.no_grad():
        torch.testing.assert_close(torch.cat([m(x) for m in layers], dim=-1), expected)
    for m in layers:
        assert m.weight.untyped_storage().data_ptr() == fused.weight.untyped_storage().data_ptr()


def test_one_row_and_a_batch_agree_row_by_row():
    """A decode row gives the same projection alone (the [in, out] path) as inside a batch (F.linear):
    the two kernels differ, the values must not, beyond rounding."""
    torch.manual_seed(0)
    layers = [nn.Linear(64, 96, bias=False), nn.Linear(64, 96, bias=False)]
    fused = FusedLinear(layers)
    batch = torch.randn(9, 64)
    with torch.no_grad():
        together = fused(batch)
        alone = torch.cat([fused(batch[i:i + 1]) for i in range(9)])
    torch.testing.assert_close(alone, together, rtol=1e-5, atol=1e-5)


def test_several_rows_take_the_packed_weight_where_onednn_has_it_and_compile_through_it():
    torch.manual_seed(1)
    layers = [nn.Linear(40, 24, bias=True), nn.Linear(40, 8, bias=True)]
    fused = FusedLinear(layers)
    assert (fused.packed is not None) == cpu_linear.packs(torch.float32)
    assert cpu_linear.packs(torch.float32) == torch.backends.mkldnn.is_available()  # this project's CPUs
    assert not cpu_linear.packs(torch.float64)  # float32 only: what was measured
    x = torch.randn(6, 40)
    with torch.no_grad():
        expected = torch.cat([m(x) for m in layers], dim=-1)
        compiled = torch.compile(lambda t: fused(t), fullgraph=True, dynamic=False)(x)
    torch.testing.assert_close(compiled, expected, rtol=1e-5, atol=1e-5)
