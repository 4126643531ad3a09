"""Why a dry run's parameter bytes are a real run's less one page per large block (docs/howto/memory.md,
"the same measurement sizes models too large to run"): the real run places every generated block of
MIN_BYTES or more PAGE_OFFSET bytes into a page of its own (spmdsim.base.buffers: MPI's copies run faster so),
holding one page more for each; the dry run counts the blocks' own bytes, what the model holds, which the
estimate prices as Megatron's bytes per parameter (tests/test_estimate_ledger.py)."""
from __future__ import annotations

from pathlib import Path

import spmdsim
from spmdsim.base.buffers import MIN_BYTES, PAGE, owner
from spmdsim.models.gpt import GPTConfig, encode, load_text
from spmdsim.models.gpt.train import train

#: examples/train_gpt.py's GPT, as docs/howto/memory.md runs it.
CFG = GPTConfig(layers=4, d_model=128, heads=4, seq=64, batch=8, dropout=0.1)
TEXT = encode(load_text(20_000))


def test_a_real_run_holds_a_page_more_per_large_parameter_block_than_the_dry_run_counts():
    def body():
        model, results = train(CFG, spmdsim.world(), 2, 4, 1, TEXT, sp=True, zero=1, memory=True, check=False)
        blocks = [p.local for p in model.params.values()]
        large = sum(b.nbytes >= MIN_BYTES for b in blocks)
        placed = sum(owner(b).nbytes - b.nbytes for b in blocks)
        return results[0].memory.params, large, placed, sum(b.nbytes for b in blocks)

    real, dry = spmdsim.simulate(8, body), spmdsim.simulate(8, body, dry_run=True)
    for (params, large, placed, own), (dry_params, _, dry_placed, dry_own) in zip(real, dry):
        assert (dry_params, dry_placed) == (own, 0) and dry_own == own
        assert params - dry_params == placed == large * PAGE
    assert real[0][1] == 8 and (real[0][0], dry[0][0]) == (1_654_784 + 8 * PAGE, 1_654_784)


def test_the_memory_page_says_what_the_runs_report():
    """The page called the gap "the few bytes the generator rounds a parameter's block up to": 32,768 here."""
    page = " ".join((Path(__file__).resolve().parents[1] / "docs" / "howto" / "memory.md").read_text().split())
    assert ("The page's first command reports parameters 1,687,552 and with `--dry-run` 1,654,784: rank 0's 8 MLP "
            "blocks of 128 x 128 float64, a page each, 32,768 bytes") in page
    assert "parameters 1,687,552, gradients 1,654,784" in page  # the first command's output, quoted above it
