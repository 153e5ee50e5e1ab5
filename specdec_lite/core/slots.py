"""One slot rule for every cache whose rows roll back by different counts (a batch): the target's masked slots
(``lm.HFCausalLM``) and the EAGLE head's cache (``drafts.heads.MaskedHeadCache``).

Every forward appends the same number of slots to every row; ``Slots`` says which of them hold an entry of their
row (the others are holes: left pads, rolled-back entries, entries a row had made already), twice: on the host
(``host``), where the bookkeeping reads it, and on the model's device (``device``), where attention masks are made
from it. A rollback marks holes (``keep``); then ``trim`` drops the last slots where they are holes in every row,
and ``compaction`` packs each row's entries to the left, in order, when that frees at least ``compact_min`` slots
and more than ``compact_share`` of them. The cache applies both to its own tensors (keys and values, and whatever
it keeps per slot). No step reads the device.
"""
from __future__ import annotations

import torch


class Slots:
    """The (B, S) occupancy of a cache's slots, on the host and on the cache's device (the module's text)."""

    compact_min, compact_share = 16, 0.25

    def __init__(self, host: torch.Tensor, device: torch.device):
        self.host = host
        self.device = host.to(device, non_blocking=True)  # from pageable memory: copied at once, no wait

    @property
    def width(self) -> int:
        return self.host.shape[1]

    def append(self, fresh: torch.Tensor) -> torch.Tensor:
        """Add the slots of a forward: ``fresh`` (B, n) host bools, True where a slot holds an entry. Returns the
        new slots' occupancy on the device."""
        new = (torch.ones(fresh.shape, dtype=torch.bool, device=self.device.device) if bool(fresh.all())
               else fresh.to(self.device.device, non_blocking=True))
        self.host = torch.cat([self.host, fresh], dim=1)
        self.device = torch.cat([self.device, new], dim=1)
        return new

    def keep(self, host: torch.Tensor) -> None:
        """The occupancy after a rollback: ``host`` (B, S), the entries each row keeps (holes stay holes)."""
        self.host = host
        self.device = host.to(self.device.device, non_blocking=True)

    def trim(self) -> int:
        """Drop the last slots where they are holes in every row; returns how many went."""
        used = self.host.any(0).nonzero()
        width = int(used[-1]) + 1 if len(used) else 0
        dropped = self.width - width
        if dropped:
            self.host, self.device = self.host[:, :width], self.device[:, :width]
        return dropped

    def compaction(self) -> torch.Tensor | None:
        """When packing every row's entries to the left frees enough slots (the module's text): the host index
        (B, width) of the slots each row keeps, in order, to gather the cache's tensors with; the occupancy is
        then packed. Else None."""
        counts = self.host.sum(1)
        width = int(counts.max()) if self.host.numel() else 0
        saved = self.width - width
        if saved < max(self.compact_min, 1) or saved <= self.compact_share * self.width:
            return None
        order = torch.sort(self.host.logical_not().to(torch.uint8), dim=1, stable=True).indices[:, :width]
        self.keep(torch.arange(width)[None, :] < counts[:, None])
        return order

    @property
    def full(self) -> bool:
        """Whether every slot holds an entry (a cache may then drop the mask)."""
        return bool(self.host.all())


def gathered(tensor: torch.Tensor, order: torch.Tensor, moved: dict) -> torch.Tensor:
    """``tensor`` (B, heads, S, d) with row b's slots ``order[b]`` (B, width), in that order; ``moved`` caches the
    order on each device it is needed on."""
    index = moved.setdefault(tensor.device, order.to(tensor.device, non_blocking=True))
    return tensor.gather(2, index[:, None, :, None].expand(-1, tensor.shape[1], -1, tensor.shape[3]))


def keep_first(mask: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """``mask`` (B, S) with only the first ``counts[b]`` True slots of each row left True."""
    return mask & (mask.cumsum(1) <= counts[:, None])
