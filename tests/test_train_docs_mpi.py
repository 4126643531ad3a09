"""Every MPI training command the training how-to pages (DOCS) show (``# long``) runs on every rank and PASSes.

Each runs with ``--steps 2 --sample 0`` in place of its step count, as the pages' simulated commands do
(tests/test_train_memory_docs.py, test_train_vocab_docs.py, test_train_bf16_docs.py, test_replay_docs.py,
which leave their MPI commands to this file: docs_commands.mpi_long). ONE mpiexec job per rank count runs them
in turn, each as `python examples/train_gpt.py ARGS` would on every rank (docs_commands.run_long_together):
a launch per command cost 13-15 CPU-s on 2 cores (8 ranks starting Python and spmdsim), five together 33.
"""
from __future__ import annotations

import pytest

from docs_commands import mpi_long, quotes, run_long_together
from testkit import MPIEXEC

DOCS = ("docs/howto/memory.md", "docs/howto/bf16.md", "docs/howto/train-gpt.md", "docs/howto/replay.md",
        "docs/howto/fsdp.md")


def _commands() -> list:
    return [q for doc in DOCS for q in quotes(doc) if mpi_long(q)]


def test_the_pages_show_the_commands_this_file_runs():
    shown = _commands()
    assert [(q.doc, q.mpi[0]) for q in shown] == [("docs/howto/memory.md", 8), ("docs/howto/bf16.md", 8)] + \
        [("docs/howto/train-gpt.md", 8)] * 2 + [("docs/howto/replay.md", 8), ("docs/howto/replay.md", 4)] + \
        [("docs/howto/fsdp.md", 8)]
    assert sum("--precision bf16-mixed" in q.command for q in shown) == 1
    assert sum("--vocab 50257" in q.command for q in shown) == 2
    assert sum("--replay" in q.command for q in shown) == 2


@pytest.fixture(scope="module")
def ran() -> dict:
    """{quote: (each rank's exit code, the job's output for it)}: one mpiexec job per rank count."""
    if not MPIEXEC:
        pytest.skip("no mpiexec")
    shown, done = _commands(), {}
    for ranks in sorted({q.mpi[0] for q in shown}):
        done.update(run_long_together([q for q in shown if q.mpi[0] == ranks], MPIEXEC))
    return done


@pytest.mark.parametrize("index", range(7))
def test_an_mpi_command_runs_two_steps_on_every_rank_and_passes(index, ran):
    quote = _commands()[index]
    codes, out = ran[quote]
    assert codes == [0] * quote.mpi[0], f"{quote.where()}: exit codes {codes}\n{out}"
    gradients = 19 if "--layers 1 " in quote.command else 64  # a GPT of 1 layer, or of 4 (the default)
    assert f"check: 2 steps vs one numpy process (loss, {gradients} gradients and parameters each): PASS" in out, out
    if "--vocab 50257" in quote.command:
        assert "vocab 50,257 padded to " in out, out
    if "--precision bf16-mixed" in quote.command:
        assert "tolerances under bf16-mixed: loss 6.1e-05, gradients 4.7e-02, parameters 9.5e-07" in out, out
