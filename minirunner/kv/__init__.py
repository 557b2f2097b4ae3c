"""The paged KV cache's bookkeeping: physical blocks (BlockPool), per-request block tables, and the
manager that allocates, shares (prefix caching) and frees them. Tensors live in the runner."""

from minirunner.kv.block_pool import BlockPool
from minirunner.kv.block_table import BlockTable
from minirunner.kv.manager import KVCacheManager

__all__ = ["BlockPool", "BlockTable", "KVCacheManager"]
