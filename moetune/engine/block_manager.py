"""BlockManager: the paged KV cache's bookkeeping — which blocks each sequence owns, which are free,
and which full blocks hold a known token prefix (automatic prefix caching).

A block's prefix key is (key of the block before it, its tokens), so two sequences share a
block only when everything before it matches too. Blocks are reference-counted: a prefix shared
by several sequences is stored once. A freed block keeps its key until it is handed out again
(free blocks are reused least recently freed first), so a later request with the same prefix
finds it. The cached prefix never covers a prompt's last token: that token is always computed,
since its logits sample the first output token. Block ids run 1..num_blocks (0 is the cache's
null block); every block handed out by `grow` is listed in `granted` until the runner clears it.
"""

from __future__ import annotations

from collections import OrderedDict

from moetune.engine.sequence import Sequence

BlockKey = tuple[int, tuple[int, ...]]  # (hash of the previous block's key, tokens of this block)


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, prefix_caching: bool = True):
        self.num_blocks, self.block_size = num_blocks, block_size
        self.prefix_caching = prefix_caching
        self.ref_counts = [0] * (num_blocks + 1)
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(1, num_blocks + 1))  # oldest first
        self._key_of: list[BlockKey | None] = [None] * (num_blocks + 1)
        self.granted: list[int] = []  # fresh blocks handed out since the last step (to be zeroed)
        self._by_hash: dict[int, int] = {}  # hash(key) → block

    @property
    def num_free(self) -> int:
        return len(self._free)

    def blocks_for(self, num_tokens: int) -> int:
        return (num_tokens + self.block_size - 1) // self.block_size

    def admit(self, seq: Sequence) -> int:
        """Give a sequence without blocks the cached blocks of its longest known prefix; returns the
        number of tokens found (they count as computed)."""
        seq.block_table, seq.block_hashes, seq.num_computed_tokens = [], [], 0
        if not self.prefix_caching:
            return 0
        bs, parent = self.block_size, 0
        for j in range((seq.num_tokens - 1) // bs):
            key = (parent, tuple(seq.token_ids(j * bs, (j + 1) * bs)))
            block = self._by_hash.get(hash(key))
            if block is None or self._key_of[block] != key:
                break
            self._take(block)
            seq.block_table.append(block)
            seq.block_hashes.append(parent := hash(key))
        seq.num_computed_tokens = seq.num_cached_tokens = len(seq.block_table) * bs
        return seq.num_computed_tokens

    def can_grow(self, seq: Sequence, num_tokens: int) -> bool:
        return self.blocks_for(num_tokens) - len(seq.block_table) <= self.num_free

    def grow(self, seq: Sequence, num_tokens: int) -> None:
        """Own enough blocks for the first `num_tokens` tokens (call can_grow first)."""
        for _ in range(self.blocks_for(num_tokens) - len(seq.block_table)):
            block, _ = self._free.popitem(last=False)
            self._forget(block)
            self.ref_counts[block] = 1
            seq.block_table.append(block)
            self.granted.append(block)

    def commit(self, seq: Sequence) -> None:
        """After a step: record the prefix key of every block the sequence has newly filled."""
        if not self.prefix_caching:
            return
        bs = self.block_size
        for j in range(len(seq.block_hashes), seq.num_computed_tokens // bs):
            parent = seq.block_hashes[-1] if seq.block_hashes else 0
            key = (parent, tuple(seq.token_ids(j * bs, (j + 1) * bs)))
            block, h = seq.block_table[j], hash(key)
            seq.block_hashes.append(h)
            if self._key_of[block] is None and h not in self._by_hash:
                self._key_of[block], self._by_hash[h] = key, block

    def trim(self, seq: Sequence, num_tokens: int) -> None:
        """Give back the blocks past the first `num_tokens` tokens (a verify step's rejected draft
        tokens: their blocks were granted fresh this step and hold no committed prefix)."""
        keep = self.blocks_for(num_tokens)
        while len(seq.block_table) > keep:
            block = seq.block_table.pop()
            self.ref_counts[block] -= 1
            if self.ref_counts[block] == 0:
                self._free[block] = None

    def free(self, seq: Sequence) -> None:
        """Release the sequence's blocks (last block first, so a prefix's tail is reused first)."""
        for block in reversed(seq.block_table):
            self.ref_counts[block] -= 1
            if self.ref_counts[block] == 0:
                self._free[block] = None
        seq.block_table, seq.block_hashes = [], []

    def _take(self, block: int) -> None:
        if self.ref_counts[block] == 0:
            del self._free[block]
        self.ref_counts[block] += 1

    def _forget(self, block: int) -> None:
        key = self._key_of[block]
        if key is not None:
            self._by_hash.pop(hash(key), None)
            self._key_of[block] = None
