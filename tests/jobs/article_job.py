"""The blog post this project grew from, with only the import changed: a Keras 2 notebook saving
``weights-{epoch:02d}-{val_acc:.3f}.hdf5`` files every epoch, then resuming from the newest one.

    python tests/jobs/article_job.py FOLDER --epochs 3 --reference ref.npz --reference-epochs 5
    python tests/jobs/article_job.py FOLDER --epochs 5 --resume --dump out.npz

The first session trains ``--epochs`` with ``resumable.ModelCheckpoint`` (``verbose=1``, as in
the post), then goes on in memory to ``--reference-epochs`` without a callback and writes those
weights to ``--reference``: what the second session must reach. The second session loads the newest file
with ``resumable.load_model``, continues with ``fit(initial_epoch=N)`` as the post does, writes its
final weights to ``--dump``, saves the model as ``after.keras`` and prints ``AFTER <optimizer>
<iterations>`` of that file loaded back by Keras. (``shuffle=False``: the post shuffles, but a
new process draws another order, and the weights are compared bitwise here.)
"""

from __future__ import annotations

import argparse
import glob
import os
import re

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

import keras  # noqa: E402
import numpy as np  # noqa: E402
from keras import Sequential  # noqa: E402
from keras.layers import Dense  # noqa: E402

import resumable  # noqa: E402


def data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(300, 56)).astype("float32")
    return x, (x[:, 0] + x[:, 1] > 0).astype("float32")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("folder")
    parser.add_argument("--epochs", type=int, required=True)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--reference")
    parser.add_argument("--reference-epochs", type=int, default=0)
    parser.add_argument("--dump")
    args = parser.parse_args()
    keras.utils.set_random_seed(7)
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        tf.config.experimental.enable_op_determinism()
    x_train, y_train = data()

    filepath = args.folder + "/weights-{epoch:02d}-{val_accuracy:.3f}.hdf5"
    checkpoint = resumable.ModelCheckpoint(filepath, monitor="val_accuracy", verbose=1, mode="max")
    callbacks_list = [checkpoint]

    if not args.resume:
        classifier = Sequential()
        classifier.add(keras.Input((56,)))
        classifier.add(Dense(10, activation="relu"))
        classifier.add(Dense(10, activation="relu"))
        classifier.add(Dense(1, activation="sigmoid"))
        classifier.compile(optimizer="adam", loss="binary_crossentropy", metrics=["accuracy"])
        classifier.fit(x_train, y_train, batch_size=100, epochs=args.epochs,
                       validation_data=(x_train, y_train), callbacks=callbacks_list, shuffle=False)
        classifier.fit(x_train, y_train, batch_size=100, epochs=args.reference_epochs,
                       initial_epoch=args.epochs, validation_data=(x_train, y_train), shuffle=False,
                       verbose=0)
        np.savez(args.reference, *classifier.get_weights())
        return

    newest = sorted(glob.glob(args.folder + "/weights-*.hdf5"))[-1]
    initial_epoch = int(re.search(r"weights-(\d+)-", newest).group(1))  # type: ignore[union-attr]
    classifier = resumable.load_model(newest)
    classifier.fit(x_train, y_train, batch_size=100, epochs=args.epochs, validation_data=(x_train, y_train),
                   callbacks=callbacks_list, initial_epoch=initial_epoch, shuffle=False)
    np.savez(args.dump, *classifier.get_weights())
    classifier.save(args.folder + "/after.keras")
    after = keras.saving.load_model(args.folder + "/after.keras")
    print(f"AFTER {type(after.optimizer).__name__} {int(np.asarray(after.optimizer.iterations))}", flush=True)


if __name__ == "__main__":
    main()
