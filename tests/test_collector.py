"""spmdsim.base.collector: the cyclic collector's thresholds raised for a search's block, and put back after."""
from __future__ import annotations

import gc

import pytest

from spmdsim.base.collector import THRESHOLDS, collect_less, fewer_collections
from spmdsim.models.gpt import GPTConfig
from spmdsim.tools.estimate.machine import load_machine
from spmdsim.tools.estimate.search import search


@pytest.fixture
def thresholds():
    """Python's default thresholds for the test, this process's own after it."""
    saved = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    yield
    gc.set_threshold(*saved)


def test_the_block_collects_less_and_puts_the_thresholds_back(thresholds):
    with fewer_collections():
        assert gc.get_threshold() == THRESHOLDS
    assert gc.get_threshold() == (700, 10, 10)
    with pytest.raises(ValueError), fewer_collections():  # put back after an error too
        raise ValueError
    assert gc.get_threshold() == (700, 10, 10)


def test_higher_thresholds_are_kept_and_a_collector_turned_off_stays_off(thresholds):
    gc.set_threshold(100_000, 5, 50)
    collect_less()
    assert gc.get_threshold() == (100_000, 20, 50)
    gc.set_threshold(0, 10, 10)  # threshold 0: no automatic collection
    with fewer_collections():
        assert gc.get_threshold() == (0, 10, 10)


def test_a_search_prices_its_configurations_with_the_thresholds_raised(thresholds):
    seen = []

    def pricer(cfg, c, machine, precision, kept):
        seen.append(gc.get_threshold())
        return 1.0 + c.tp + c.pp, 1, 1

    cfg = GPTConfig(layers=2, d_model=32, heads=2, seq=64, batch=4, vocab=128)
    result = search(cfg, 4, load_machine("a100-dgx"), 1 << 40, pricer=pricer, cells=False)
    assert result.chosen is not None and seen and set(seen) == {THRESHOLDS}
    assert gc.get_threshold() == (700, 10, 10)


def test_an_estimates_dry_run_runs_with_the_thresholds_raised(thresholds, monkeypatch):
    from spmdsim.tools.estimate import ledger

    seen = []
    real = ledger.dry_run

    def dry_run(key):
        seen.append(gc.get_threshold())
        return real(key)

    monkeypatch.setattr(ledger, "dry_run", dry_run)
    # (a model no other test prices: gpt_ledger keeps the runs it made in this process)
    cfg = GPTConfig(layers=2, d_model=24, heads=2, seq=12, batch=2, vocab=62, dropout=0.0)
    assert ledger.gpt_ledger(cfg, 1, 1, 2, sp=True, gpus_per_node=8) and seen == [THRESHOLDS]
    assert gc.get_threshold() == (700, 10, 10)
