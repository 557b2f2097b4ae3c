"""FusedLinear: the stacked projections compute what the separate nn.Linear layers compute, on both
of its CPU paths (one row through the [in, out] copy, several rows through F.linear), and the layers'
parameters stay views of the fused weight (no second copy of the checkpoint's values)."""

import pytest
import torch
from torch import nn

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
