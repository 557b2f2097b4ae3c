"""Device mirrors of the persistent state rows, for the GPU-native input path (MRv2's staged writes).

Owns the device copies of every state row's block-table row and num_computed_tokens, and bringing them
up to date each step with staged writes of only what changed: the block-table cells the state rows
(worker/states.py) recorded since the last step, and the scheduled rows' token counts, packed with the
step's idx_mapping and query_lens into one host array, copied without blocking and scattered on the
device. Also which input-prep kernel reads them (minirunner/kernels/input_prep.py: Triton, or its torch twin),
chosen once. It never decides what a row holds (states.py does) and never writes a step buffer
(buffers.py runs the kernel over these mirrors).
"""

from __future__ import annotations

import numpy as np
import torch

from minirunner.core.host_copy import to_device
from minirunner.kernels._triton import use_triton
from minirunner.kernels.input_prep import prepare_inputs, prepare_inputs_ref
from minirunner.worker.states import RequestStateRows

_INT32_MAX = (1 << 31) - 1


class StateMirror:
    """block_tables: int32 [state capacity, max blocks per seq] and num_computed: int32 [state capacity]
    on the device, equal to the host rows' after each ``stage``. ``triton``: use the Triton kernel (None:
    where the device is CUDA and Triton is installed; on a CPU it runs only under TRITON_INTERPRET=1)."""

    def __init__(self, state: RequestStateRows, device: torch.device, triton: bool | None = None):
        self.state, self.device = state, device
        state.record_writes()
        self.block_tables = self._upload(state.block_tables)
        self.num_computed = torch.zeros(state.block_tables.shape[0], dtype=torch.int32, device=device)
        triton = use_triton(device) if triton is None else triton
        self.kernel = prepare_inputs if triton else prepare_inputs_ref

    def _upload(self, tables: np.ndarray) -> torch.Tensor:
        if tables.size > _INT32_MAX:
            raise ValueError(f"the state rows' block tables hold {tables.size} cells, more than int32 "
                             "indices reach: lower max_num_seqs or max_model_len, or raise block_size")
        return torch.from_numpy(tables).to(self.device, copy=True)

    def stage(self, rows: np.ndarray, query_lens: np.ndarray, num_computed: np.ndarray
              ) -> tuple[torch.Tensor, torch.Tensor]:
        """Bring the mirrors up to date for a step over the state rows ``rows`` (int64 [n], distinct)
        that schedules ``query_lens`` tokens after ``num_computed`` (int64 [n] each): one copy without
        blocking of the step's inputs and the block-table cells written since the last step, then two
        scatters on the device. Returns (idx_mapping, query_lens): int32 [n] on the device."""
        state = self.state
        if state.block_tables.shape[0] > self.block_tables.shape[0]:  # the host rows doubled
            self.block_tables = self._upload(state.block_tables)
            grown = torch.zeros(state.block_tables.shape[0], dtype=torch.int32, device=self.device)
            grown[:self.num_computed.shape[0]] = self.num_computed
            self.num_computed = grown
        cells, blocks = state.drain_writes()
        n, m = len(rows), len(cells)
        packed = np.empty(3 * n + 2 * m, dtype=np.int32)
        packed[:n], packed[n:2 * n], packed[2 * n:3 * n] = rows, query_lens, num_computed
        packed[3 * n:3 * n + m], packed[3 * n + m:] = cells, blocks
        staged = to_device(packed, self.device)
        idx_mapping = staged[:n]
        self.num_computed[idx_mapping.long()] = staged[2 * n:3 * n]
        if m:
            self.block_tables.view(-1)[staged[3 * n:3 * n + m].long()] = staged[3 * n + m:]
        return idx_mapping, staged[n:2 * n]
