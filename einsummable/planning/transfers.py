"""What an exchange program is: transfers between devices in rounds, partial-sum folds, and
the readers' stitching copies. `exchange.synthesize` makes them, `timing.exchange_time` prices
them, lowering turns them into sends, receives and reduces."""
from __future__ import annotations

from dataclasses import dataclass

from ..core.geometry import Region, contains, contiguous_slice, region_shape, relative

MODES = ("optimized", "naive", "naive-routed")


NAIVE_MODES = ("naive", "naive-routed")


@dataclass(frozen=True)
class Transfer:
    """`region` of `tensor` moves from src to dst along `hops` (src ... dst) in `round`.

    `slices` is () for a full value, else the partial slices the sent value folds together
    (kind "partial", on its way to a reducer)."""

    src: int
    dst: int
    tensor: str
    region: Region
    nbytes: int
    kind: str
    round: int
    hops: tuple[int, ...]
    slices: tuple[int, ...] = ()


@dataclass(frozen=True)
class Reduce:
    """On `device`, after the transfers of `round`, fold `n_inputs` values of `region` (each
    holding the slices in `inputs[i]`) into one holding `out` (() = the full value)."""

    device: int
    tensor: str
    region: Region
    n_inputs: int
    round: int
    inputs: tuple[tuple[int, ...], ...]
    out: tuple[int, ...]
    nbytes: int


@dataclass(frozen=True)
class Exchange:
    """`copies`: (device, bytes, kernels) the readers copy to stitch needs from several parts:
    their own parts, and received parts that cannot land in place (not a contiguous range of
    the need); a received part that is contiguous is written where it belongs, no copy.
    `packs`: (round, device, bytes, kernels) a sender copies into contiguous messages before
    it sends strided parts of a block in that round (one pack kernel per transfer).
    `sources`: the producer's pieces (region, device, partial slices) in the order lowering
    holds them, which decides the buffer each send reads (`replay.py`). `early`: the part of
    `copies` whose needs copy no received part (own parts only): a reader runs those before
    anything arrives; `copied`: the received parts (device, region) the other copies read,
    which they wait for. `one_pack`: a device's strided sends of a round share one pack
    kernel (`pack_groups`) rather than one each. `flat`: every transfer went into the round
    after its source was ready (`exchange._Synthesis.flat`), so a round's transfers may share
    a link (the network shares it), where other programs' rounds give each link one route."""
    transfers: tuple[Transfer, ...]
    reduces: tuple[Reduce, ...] = ()
    copies: tuple[tuple[int, int, int], ...] = ()
    packs: tuple[tuple[int, int, int, int], ...] = ()
    sources: tuple[tuple[Region, int, tuple[int, ...]], ...] = ()
    early: tuple[tuple[int, int, int], ...] = ()
    copied: tuple[tuple[int, Region], ...] = ()
    one_pack: bool = False
    flat: bool = False
    # The exchange is this one repeated on every node, on disjoint devices and links
    # (`node_copies.py`): it takes one copy's time, and is timed as that copy.
    one_copy: "Exchange | None" = None

    @property
    def n_rounds(self) -> int:
        rounds = [t.round for t in self.transfers] + [r.round for r in self.reduces]
        return (max(rounds) + 1) if rounds else 0

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.transfers)

    def __bool__(self) -> bool:
        return bool(self.transfers or self.reduces)


EMPTY = Exchange(())



def pack_groups(ex: Exchange) -> dict[int, tuple[int, ...]]:
    """The strided sends a device packs with one kernel where exchanges run as programs
    (`timing.replays`): per (sender, round), the transfers whose region is a strided part of
    a producer piece the sender holds (`Exchange.sources`, the first that contains it, as
    lowering finds it), two or more; keyed by the first of them in program order; none
    unless `ex.one_pack`. One copy kernel lays them end to end and each leaves as a
    contiguous view of it: a kernel launch per strided send was most of a small all-to-all
    (a100x8, 1 MiB: 0.045 -> 0.020 ms), while for large ones every send then waits for the
    whole pack (1 GiB: 0.488 -> 0.561), so synthesis keeps the faster (`exchange._fastest`)."""
    if not ex.one_pack:
        return {}
    groups: dict[tuple[int, int], list[int]] = {}
    order = sorted(range(len(ex.transfers)), key=lambda i: (ex.transfers[i].round, i))
    for i in order:
        t = ex.transfers[i]
        piece = next((reg for reg, dev, slices in ex.sources
                      if dev == t.src and slices == t.slices and contains(reg, t.region)), None)
        if piece is not None and t.region != piece and not contiguous_slice(
                region_shape(piece), relative(t.region, piece)):
            groups.setdefault((t.src, t.round), []).append(i)
    return {members[0]: tuple(members) for members in groups.values() if len(members) > 1}
