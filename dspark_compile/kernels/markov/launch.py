"""How the Markov walk is launched: padded rows, tile width, warps and the grid, by batch,
vocabulary, Markov rank and the GPU's multiprocessors (plain Python, no Triton)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Launch:
    """How the walk is launched: requests padded to ``rows`` (the tensor cores' and
    Triton's power-of-two shapes), ``block`` columns per tile, ``warps`` per program, and
    at most ``programs_per_sm`` programs per streaming multiprocessor, each taking a run
    of whole tiles (fewer programs, fewer partial results for the last one to reduce),
    with ``stages`` tiles of W2 in flight (Triton's software pipeline; 3 is its default).
    ``resident``: one launch for all k steps, each program holding one tile of W2 on chip
    for the whole walk (where W2 fits in the multiprocessors' shared memory); otherwise
    one launch per step, streaming W2."""

    rows: int
    block: int
    warps: int
    programs_per_sm: int
    stages: int = 3
    resident: bool = False


# (block, warps, programs per SM) by padded batch where W2 is streamed every step: the
# fastest greedy launches timed on the 27B lane at 16, 32 and 64 rows (64 rows also the
# 35B-A3B lane's fastest), stages among the launches tried. Past 64 rows an untried
# guess. All free of register spills on sm_90 (128 columns at 64 rows spill and overflow
# shared memory).
LAUNCHES = {16: (128, 8, 1), 32: (128, 8, 1), 64: (64, 8, 1)}
# W2 bytes a resident program keeps in shared memory (an H200 program has 227 KB), and
# the most rows it drafts: past 16 its tile no longer fits in registers without spills
RESIDENT_BYTES = 128 * 1024
RESIDENT_ROWS = 16
# the most rows a certified step takes: past 16 its bounds spill registers on sm_90, and
# the union of more requests' contenders is most of W2 on the testbed's rounds
CERTIFIED_ROWS = 16
# tiles a program of the certified walk's pre-pass takes at once
PREPASS_TILES = 16


def candidate_segment(tiles: int, count: int) -> int:
    """Tiles in each of the (at most ``count``) segments of the vocabulary whose best
    columns are the certified step's candidates: whole pre-pass programs' tiles."""
    groups = -(-tiles // PREPASS_TILES)
    return PREPASS_TILES * -(-groups // count)


def launch_shape(rows: int, vocab: int, rank: int, sms: int) -> Launch:
    """The launch for ``rows`` requests over a draft vocabulary of ``vocab`` and a Markov
    rank of ``rank`` on ``sms`` multiprocessors: resident where one tile per
    multiprocessor holds all of W2, streamed otherwise."""
    padded = max(16, 1 << (rows - 1).bit_length())
    columns = max(16, 1 << (-(-vocab // sms) - 1).bit_length())
    if padded <= RESIDENT_ROWS and columns * rank * 2 <= RESIDENT_BYTES:
        # 8 warps: the W2 tile passes through their registers on its way to shared memory
        return Launch(padded, columns, 8, 1, resident=True)
    return Launch(padded, *LAUNCHES.get(padded, (32, 8, 1)))


def grid(launch: Launch, tiles: int, sms: int) -> tuple[int, int]:
    """(programs, tiles per program) on ``sms`` multiprocessors: runs of equal length, as
    many programs as fit."""
    per_program = -(-tiles // min(tiles, sms * launch.programs_per_sm))
    return -(-tiles // per_program), per_program


def reduction_chunk(launch: Launch, programs: int) -> int:
    """How many programs' bests a reducing program loads at once: all of them, up to 4096
    values."""
    return min(1 << (programs - 1).bit_length(), max(32, 4096 // launch.rows))
