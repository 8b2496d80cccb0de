#!/usr/bin/python3
"""Writes small broken datasets for the bad-input tests into DIR."""
import os
import sys

import h5py
import numpy as np

d = sys.argv[1]
os.makedirs(d, exist_ok=True)
rng = np.random.default_rng(0)


def dataset(name, images, labels, **attrs):
    with h5py.File(os.path.join(d, name), "w") as f:
        if images is not None:
            f["train/images"] = images
        if labels is not None:
            f["train/labels"] = labels
        for k, v in attrs.items():
            f.attrs[k] = v


img = rng.integers(0, 255, size=(100, 8, 8), dtype=np.uint8)
lab = rng.integers(0, 10, size=(100,), dtype=np.uint8)
dataset("good.h5", img, lab, classes=10)
dataset("no_labels.h5", img, None)
dataset("float64_images.h5", img.astype(np.float64), lab)
dataset("row_mismatch.h5", img, lab[:99])
bad = lab.copy()
bad[42] = 10
dataset("label_out_of_range.h5", img, bad, classes=10)
dataset("flat_images.h5", img.reshape(-1), lab)
with open(os.path.join(d, "not_hdf5.h5"), "w") as f:
    f.write("this is not an HDF5 file\n")
