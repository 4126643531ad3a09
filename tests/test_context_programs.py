"""Context parallelism's pure programs (spmdsim.programs.context): the balanced causal split, ring
attention's steps and messages, each method's bytes, and `spmdsim context`."""
from __future__ import annotations

import subprocess

import pytest

from docs_commands import run_here
from testkit import unfold
from spmdsim.errors import ShapeError
from spmdsim.programs.context import (Attend, Pass, causal_pairs, check_heads, check_split, imbalance, order,
                                      positions, ring_program, traffic)


@pytest.mark.parametrize("cp", [1, 2, 3, 4, 8])
def test_the_balanced_split_gives_every_rank_the_same_causal_work_and_the_naive_one_does_not(cp):
    seq = 2 * cp * 16
    brute = [sum(p + 1 for p in positions(r, cp, seq)) for r in range(cp)]  # keys at or before each query
    assert [causal_pairs(r, cp, seq) for r in range(cp)] == brute and len(set(brute)) == 1
    z = seq // cp
    naive = [causal_pairs(r, cp, seq, balanced=False) for r in range(cp)]
    assert naive == [z * z * r + z * (z + 1) // 2 for r in range(cp)]
    assert imbalance(cp, seq) == 1.0 and imbalance(cp, seq, False) == naive[-1] / naive[0]


@pytest.mark.parametrize("cp, balanced", [(2, True), (4, True), (5, True), (4, False)])
def test_each_ranks_tokens_are_its_block_of_the_order(cp, balanced):
    seq = 2 * cp * 3
    laid = order(cp, seq, balanced)
    assert sorted(laid) == list(range(seq))
    block = seq // cp
    assert all(laid[r * block:(r + 1) * block] == positions(r, cp, seq, balanced) for r in range(cp))


@pytest.mark.parametrize("cp", [2, 3, 4, 8])
@pytest.mark.parametrize("balanced", [True, False])
def test_the_ring_attends_each_ranks_block_once_and_its_work_is_the_causal_masks(cp, balanced):
    seq = 2 * cp * 8
    for r in range(cp):
        program = ring_program(r, cp, 100, ("context",), balanced, seq=seq)
        attends = [a for a in program.forward if isinstance(a, Attend)]
        assert [a.source for a in attends] == [(r - s) % cp for s in range(cp)]
        assert [a.source for a in program.backward if isinstance(a, Attend)] == [a.source for a in attends]
        assert program.pairs(seq) == causal_pairs(r, cp, seq, balanced)  # blocks summed = positions counted


@pytest.mark.parametrize("cp", [2, 3, 4, 8])
def test_every_ring_message_meets_its_peer_and_the_bytes_are_the_formula(cp):
    block = 1000
    programs = [ring_program(r, cp, block, ("context",)) for r in range(cp)]
    for phase in ("forward", "backward"):
        passes = [[a for a in getattr(p, phase) if isinstance(a, Pass)] for p in programs]
        assert len({len(p) for p in passes}) == 1  # every rank posts as many groups
        for r in range(cp):
            for i, group in enumerate(passes[r]):
                for peer, tag, n in group.messages.sends:  # the peer's group of the same step receives it
                    assert (r, tag, n) in passes[peer][i].messages.receives
    sent = [(p.bytes_sent(), p.bytes_sent("backward")) for p in programs]
    assert set(sent) == {(2 * (cp - 1) * block, (2 * (cp - 1) + 2 * cp) * block)}
    assert traffic("ring", cp, 3 * block, block) == sent[0]
    assert traffic("allgather", cp, 3 * block, block) == (2 * (cp - 1) * block,) * 2
    assert traffic("alltoall", cp, 4 * block, block) == ((cp - 1) * (8 * block + 2 * block) // cp,) * 2 or cp == 3


def test_refusals_name_the_value():
    with pytest.raises(ShapeError, match="sequence length 100 does not divide into 2 x cp = 6 chunks"):
        check_split(3, 100)
    with pytest.raises(ShapeError, match="context-parallel size 0 must be an int >= 1"):
        check_split(0, 8)
    with pytest.raises(ShapeError, match="splits K/V heads over tp x cp = 8: 4 K/V heads do not divide"):
        check_heads("alltoall", 4, 32, 4, tp=2)
    check_heads("ring", 4, 32, 4, tp=2)
    with pytest.raises(ShapeError, match="'zigzag' is not one of ring, allgather, alltoall"):
        traffic("zigzag", 2, 1, 1)


def _context(*args):
    """`spmdsim context ARGS` (exit code, stdout, stderr), run in this process (docs_commands.run_here): the
    command's own output and code, without a Python start and spmdsim's imports for each of five calls."""
    return subprocess.CompletedProcess(args, *run_here("main", ["context", *args]))


def test_the_command_draws_the_ring_within_100_columns_and_refuses_in_one_line():
    out = _context("--cp", "12", "--seq", "4800", "--heads", "32", "--kv-heads", "8")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert max(map(len, lines)) <= 100 and "  11  c11 c12  r11 diag   r10 keys/2" in out.stdout
    assert "(1.00x)" in out.stdout and "the naive split's: 80,200 to 1,840,200 (22.95x)" in out.stdout
    bad = _context("--cp", "3", "--seq", "100")
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) <= 2 and "Traceback" not in bad.stderr


def test_the_command_counts_one_chunk_and_one_token_in_the_singular():
    # "context parallel 1, 16 tokens, balanced causal split: 1 chunks of 16 tokens" (and "of 1 tokens").
    assert _context("--cp", "1", "--seq", "16").stdout.startswith(
        "context parallel 1, 16 tokens, balanced causal split: 1 chunk of 16 tokens\n")
    assert _context("--cp", "64", "--seq", "128").stdout.startswith(
        "context parallel 64, 128 tokens, balanced causal split: 128 chunks of 1 token\n")
    assert _context("--cp", "4", "--seq", "4096", "--split", "naive").stdout.startswith(
        "context parallel 4, 4,096 tokens, naive split: 4 chunks of 1,024 tokens\n")


def test_the_command_says_how_it_spells_numpy_s_dtype_names():
    # `--dtype float32`, as plan and collective take it, got no hint: fp32 is not a close match of float32.
    bad = _context("--cp", "4", "--seq", "4096", "--dtype", "float32")
    assert bad.returncode == 2 and "invalid choice: 'float32'; 'float32' is written 'fp32' here (choose from" \
        in unfold(bad.stderr)


def test_the_trainer_s_cp_method_flag_says_the_command_prints_every_method():
    # `spmdsim context --cp 4 --seq 4096 --cp-method ring`, as the trainer and estimate take it, said only
    # "unrecognized arguments: --cp-method ring".
    bad = _context("--cp", "4", "--seq", "4096", "--cp-method", "ring")
    assert bad.returncode == 2 and unfold(bad.stderr).splitlines()[-1].endswith(
        "unrecognized arguments: --cp-method ring; --cp-method is examples/train_gpt.py's and spmdsim estimate's, "
        "which run or price one method; context prints each method's bytes (ring, allgather, alltoall)")


def test_the_command_says_the_all_to_all_cannot_split_heads_cp_does_not_divide():
    """6 heads over cp 4 (or 2 K/V heads over 4): no all-to-all byte counts, a line saying why, as a run
    refuses it (check_heads); heads cp divides keep their counts."""
    for heads, kv, why in (("6", "6", "6 heads"), ("32", "2", "2 K/V heads")):
        out = _context("--cp", "4", "--seq", "4096", "--heads", heads, "--kv-heads", kv)
        assert out.returncode == 0, out.stderr
        assert f"  alltoall   cannot run: {why} do not divide over cp 4 (it splits the heads)" in out.stdout
        assert "  ring  " in out.stdout and "  allgather  " in out.stdout
    fine = _context("--cp", "4", "--seq", "4096", "--heads", "32", "--kv-heads", "8").stdout
    assert "  alltoall       " in fine and "cannot run" not in fine
