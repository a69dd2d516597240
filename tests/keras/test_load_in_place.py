"""Weights loaded a variable at a time in place (compat.assigned_in_place): exact, scoped to the
model being loaded, and gone once the load ends. What it saves in memory is measured in
tests/keras/test_resume_memory.py."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.lanes

keras = pytest.importorskip("keras")

from resumable.keras import compat  # noqa: E402
from resumable.keras.compat import in_place  # noqa: E402

IN_PLACE = keras.backend.backend() in ("jax", "tensorflow")  # the others load as Keras does


def trained_model(seed: int) -> keras.Model:
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(40), keras.layers.Dense(3)])
    model.compile(optimizer="adam", loss="mse")
    x = np.random.default_rng(seed).normal(size=(16, 6)).astype("float32")
    model.fit(x, x[:, :3], epochs=1, verbose=0)
    return model


def overridden(model: keras.Model) -> list[bool]:
    return ["assign" in vars(v) for v in list(model.variables) + list(model.optimizer.variables)]


def test_only_the_loaded_models_variables_are_overridden_and_only_during_the_load() -> None:
    model, other = trained_model(1), trained_model(2)
    with compat.assigned_in_place(model):
        assert all(overridden(model)) is IN_PLACE
        with compat.assigned_in_place(model):  # a load inside a load keeps the outer's override
            pass
        assert all(overridden(model)) is IN_PLACE
        assert not any(overridden(other))
    assert not any(overridden(model))


@pytest.mark.parametrize("give_back_bytes", [64, 16 * 2**20], ids=["heap given back each variable", "rarely"])
def test_loading_in_place_gives_the_saved_values_bit_for_bit(
        give_back_bytes: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The values, optimizer state included, are those saved, however often the heap is
    given back meanwhile."""
    monkeypatch.setattr(in_place, "GIVE_BACK_BYTES", give_back_bytes)
    saved = trained_model(3)
    saved.save_weights(str(tmp_path / "model.weights.h5"))
    loaded = trained_model(4)
    with open(tmp_path / "model.weights.h5", "rb") as file:
        if not compat.load_weights_from(loaded, io.BytesIO(file.read())):
            pytest.skip("this Keras loads through load_weights, not in place")
    pairs = list(zip(saved.variables + saved.optimizer.variables,
                     loaded.variables + loaded.optimizer.variables, strict=True))
    for before, after in pairs:
        before_value, after_value = keras.ops.convert_to_numpy(before), keras.ops.convert_to_numpy(after)
        assert np.array_equal(before_value, after_value), before.path
    assert not any(overridden(loaded))


def test_a_value_that_does_not_fit_is_refused_as_keras_refuses_it() -> None:
    model = trained_model(5)
    kernel = model.layers[0].kernel
    with compat.assigned_in_place(model), pytest.raises(ValueError):
        kernel.assign(np.zeros((7, 40), "float32"))  # Keras' own assign: the shape differs
    assert not any(overridden(model))


def keras_version() -> tuple[int, int]:
    return tuple(int(part) for part in keras.version().split(".")[:2])  # type: ignore[return-value]


def numpy(variable: keras.Variable) -> np.ndarray:
    return keras.ops.convert_to_numpy(variable)


def keras_assigns(model: keras.Model, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The paths of the variables that Keras' own ``assign`` is called for, from now on; no
    snapshot taken by an earlier test in this process counts (`in_place.shared_buffer`)."""
    import weakref

    monkeypatch.setattr(in_place, "_snapshot_views", weakref.WeakValueDictionary())
    called: list[str] = []
    variable_class = type(model.variables[0])
    keras_assign = variable_class.assign

    def counted(variable: keras.Variable, value: object) -> object:
        called.append(variable.path)
        return keras_assign(variable, value)

    monkeypatch.setattr(variable_class, "assign", counted)
    return called


def load(model: keras.Model, weights: Path) -> None:
    with open(weights, "rb") as file:
        if not compat.load_weights_from(model, io.BytesIO(file.read())):
            pytest.skip("this Keras loads through load_weights, not in place")


@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="TensorFlow's variables")
def test_on_tensorflow_each_array_is_written_into_the_variables_own_buffer(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Keras' assign is left to the scalars (the optimizer's counters); every array goes
    straight into its variable's buffer, bit for bit."""
    saved = trained_model(6)
    saved.save_weights(str(tmp_path / "model.weights.h5"))
    loaded = trained_model(7)
    called = keras_assigns(loaded, monkeypatch)
    load(loaded, tmp_path / "model.weights.h5")
    everything = list(zip(saved.variables + saved.optimizer.variables,
                          loaded.variables + loaded.optimizer.variables, strict=True))
    assert sorted(called) == sorted(after.path for _, after in everything if len(after.shape) == 0)
    for before, after in everything:
        assert np.array_equal(numpy(before), numpy(after)), after.path


@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="TensorFlow's variables")
def test_a_tensorflow_variable_that_copies_on_read_takes_keras_assign(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """After a sparse read (an embedding's gather), TensorFlow hands out copies of the variable:
    writing into one would lose the value. Seen, and left to Keras' assign."""
    import tensorflow as tf

    saved = trained_model(8)
    saved.save_weights(str(tmp_path / "model.weights.h5"))
    loaded = trained_model(9)
    kernel = loaded.layers[0].kernel
    tf.gather(kernel.value, [0])  # ResourceGather: the variable copies on every read from now on
    called = keras_assigns(loaded, monkeypatch)
    load(loaded, tmp_path / "model.weights.h5")
    assert kernel.path in called
    assert np.array_equal(numpy(kernel), numpy(saved.layers[0].kernel))


@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="TensorFlow's variables")
def test_a_load_while_a_snapshot_is_unwritten_leaves_the_snapshot_its_values(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A snapshot holds views of the variables' buffers and counts on copy on write (a
    notebook that loads into the model right after an interrupted fit): writing into the
    buffers would change the checkpoint it writes. Keras' assign is taken meanwhile."""
    from resumable.keras.checkpoint import model_to_files

    other = trained_model(10)
    other.save_weights(str(tmp_path / "other.weights.h5"))
    model = trained_model(11)
    before = [keras.ops.convert_to_numpy(v).copy() for v in model.variables]
    called = keras_assigns(model, monkeypatch)
    pending = model_to_files.snapshot(model, weights_only=True, state={"epoch": 1}, arrays={})
    assert pending is not None
    load(model, tmp_path / "other.weights.h5")
    assert len(called) == len(model.variables) + len(model.optimizer.variables)
    pending.write(tmp_path / "ckpt")
    written = trained_model(12)
    written.load_weights(str(tmp_path / "ckpt" / "model.weights.h5"))
    for value, variable in zip(before, written.variables, strict=True):
        assert np.array_equal(value, keras.ops.convert_to_numpy(variable)), variable.path
    del pending  # once written and dropped, loads write into the buffers again
    called.clear()
    load(model, tmp_path / "other.weights.h5")
    assert len(called) == 2  # the optimizer's two scalars


@pytest.fixture
def aligned_reads(monkeypatch: pytest.MonkeyPatch) -> list[np.ndarray]:
    """Every value counts as big (read aligned, `in_place_reads.aligned_read`); the arrays read, in order."""
    from resumable.keras.compat import in_place_reads

    monkeypatch.setattr(in_place_reads, "ALIGNED_FROM_BYTES", 1)
    read: list[np.ndarray] = []
    aligned_read = in_place_reads.aligned_read

    def recorded(dataset: object) -> np.ndarray:
        read.append(aligned_read(dataset))
        return read[-1]

    monkeypatch.setattr(in_place_reads, "aligned_read", recorded)
    return read


@pytest.mark.skipif(keras.backend.backend() != "jax", reason="JAX's arrays")
def test_on_jax_each_array_read_becomes_its_variables_buffer(
        tmp_path: Path, aligned_reads: list[np.ndarray]) -> None:
    """No copy of a big value (here every value counts as big): the array the store read is the
    buffer the variable ends with, bit for bit; only the optimizer's two scalars are copies."""
    saved = trained_model(13)
    saved.save_weights(str(tmp_path / "model.weights.h5"))
    loaded = trained_model(14)
    load(loaded, tmp_path / "model.weights.h5")
    buffers = {array.ctypes.data for array in aligned_reads}
    everything = list(zip(saved.variables + saved.optimizer.variables,
                          loaded.variables + loaded.optimizer.variables, strict=True))
    taken = [after.path for _, after in everything if after.value.unsafe_buffer_pointer() in buffers]
    assert sorted(taken) == sorted(after.path for _, after in everything if len(after.shape))
    for before, after in everything:
        assert np.array_equal(numpy(before), numpy(after)), after.path


@pytest.mark.skipif(keras.backend.backend() != "jax", reason="JAX's arrays")
def test_on_jax_a_loaded_model_trains_as_one_loaded_by_keras(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Variables whose buffers are the arrays read train on bit for bit as Keras' copies do
    (the step's donated buffers never write into them)."""
    from resumable.keras.compat import in_place_reads

    monkeypatch.setattr(in_place_reads, "ALIGNED_FROM_BYTES", 1)
    saved = trained_model(15)
    saved.save_weights(str(tmp_path / "model.weights.h5"))
    ours, keras_own = trained_model(16), trained_model(16)
    load(ours, tmp_path / "model.weights.h5")
    keras_own.load_weights(str(tmp_path / "model.weights.h5"))
    first = [numpy(v).copy() for v in ours.variables]
    x = np.random.default_rng(17).normal(size=(32, 6)).astype("float32")
    for model in (ours, keras_own):
        model.fit(x, x[:, :3], epochs=3, shuffle=False, verbose=0)
    for mine, theirs in zip(ours.variables + ours.optimizer.variables,
                            keras_own.variables + keras_own.optimizer.variables, strict=True):
        assert np.array_equal(numpy(mine), numpy(theirs)), mine.path
    assert not all(np.array_equal(a, numpy(v)) for a, v in zip(first, ours.variables, strict=True))


@pytest.mark.skipif(keras.backend.backend() != "jax", reason="JAX's arrays")
@pytest.mark.parametrize("aligned_from", [1, 2**62], ids=["read-aligned", "keras-assign"])
def test_on_jax_a_dataset_handed_to_assign_is_read_in_full(aligned_from: int, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Keras 3.8 and 3.9 hand each variable the h5py dataset itself: a big one read aligned, a
    smaller one left to Keras' assign, each as stored."""
    import h5py

    from resumable.keras.compat import in_place_reads

    monkeypatch.setattr(in_place_reads, "ALIGNED_FROM_BYTES", aligned_from)

    model = trained_model(18)
    kernel = model.layers[0].kernel
    stored = np.random.default_rng(19).normal(size=tuple(kernel.shape)).astype("float32")
    with h5py.File(tmp_path / "values.h5", "w") as file:
        file["kernel"] = stored
    with h5py.File(tmp_path / "values.h5", "r") as file, compat.assigned_in_place(model):
        kernel.assign(file["kernel"])
    assert np.array_equal(numpy(kernel), stored)


def test_big_values_are_read_aligned_and_whole(tmp_path: Path, aligned_reads: list[np.ndarray]) -> None:
    """On every backend, values of ``ALIGNED_FROM_BYTES`` or more (here all) come from the store
    in 64-byte aligned buffers, bit for bit (Keras 3.8 and 3.9 hand out the datasets instead)."""
    from resumable.keras.compat import in_place_reads

    saved = trained_model(20)
    saved.save_weights(str(tmp_path / "model.weights.h5"))
    loaded = trained_model(21)
    load(loaded, tmp_path / "model.weights.h5")
    everything = list(zip(saved.variables + saved.optimizer.variables,
                          loaded.variables + loaded.optimizer.variables, strict=True))
    for before, after in everything:
        assert np.array_equal(numpy(before), numpy(after)), after.path
    assert all(array.ctypes.data % in_place_reads.ALIGNMENT == 0 for array in aligned_reads)
    if keras_version() >= (3, 10):
        # every array of the model (the first load in a process also reads compat's probe)
        assert len(aligned_reads) >= sum(1 for _, after in everything if len(after.shape))


@pytest.fixture
def unread_reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every value counts as big on TensorFlow (handed out unread, `in_place_reads.UnreadValue`;
    Keras 3.8 and 3.9 hand out the h5py dataset itself); the addresses of the buffers each read
    of an array from the file went into. Reading an unread value whole (``np.asarray``) fails
    the test; a dataset read whole is a read into a buffer of its own, which no variable has."""
    import h5py

    from resumable.keras.compat import in_place_reads, loading

    # Their probes read their values whole, once per process: before that is refused.
    compat.sharding_works(), loading._loading_works()
    monkeypatch.setattr(in_place_reads, "UNREAD_FROM_BYTES", 1)
    buffers: list[int] = []
    read_direct = h5py.Dataset.read_direct

    def recorded(dataset: h5py.Dataset, buffer: np.ndarray, *args: object, **kwargs: object) -> None:
        if buffer.ndim:  # a scalar (the optimizer's counters) is read as Keras reads it
            buffers.append(buffer.ctypes.data)
        read_direct(dataset, buffer, *args, **kwargs)

    def refused(value: in_place_reads.UnreadValue, dtype: object = None, copy: object = None) -> np.ndarray:
        raise AssertionError(f"{value._name} was read whole, not into its variable's buffer")

    monkeypatch.setattr(h5py.Dataset, "read_direct", recorded)
    monkeypatch.setattr(in_place_reads.UnreadValue, "__array__", refused)
    return buffers


def variable_buffers(model: keras.Model) -> dict[str, int]:
    buffers = {}
    for variable in model.variables + model.optimizer.variables:
        buffer = in_place._own_buffer(variable.value)
        if buffer is not None and len(variable.shape):
            buffers[variable.path] = buffer.ctypes.data
    return buffers


@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="TensorFlow's variables")
def test_on_tensorflow_big_values_are_read_straight_into_the_variables_buffers(
        tmp_path: Path, unread_reads: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    """A big value is never held beside the model: the file is read into the buffer the variable
    already has, never into an array of its own first, bit for bit."""
    saved = trained_model(22)
    saved.save_weights(str(tmp_path / "model.weights.h5"))
    loaded = trained_model(23)
    keras_assigns(loaded, monkeypatch)  # no snapshot of an earlier test in this process counts
    load(loaded, tmp_path / "model.weights.h5")
    assert sorted(unread_reads) == sorted(variable_buffers(loaded).values())
    for before, after in zip(saved.variables + saved.optimizer.variables,
                             loaded.variables + loaded.optimizer.variables, strict=True):
        assert np.array_equal(numpy(before), numpy(after)), after.path


def sharded_weights(model: keras.Model, folder: Path) -> Path:
    """``model``'s weights as Keras' sharded weights, each value in a shard of its own, so that a
    layer's kernel and bias lie in different shards."""
    path = folder / "model.weights.json"
    try:
        model.save_weights(str(path), max_shard_size=1000 / 2**30)  # over the biggest value, 960 B
    except TypeError:
        pytest.skip("this Keras writes no shards")
    if not compat.sharding_works():
        pytest.skip("this Keras' sharded store does not read back")
    return path


@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="TensorFlow's variables")
def test_a_value_whose_shard_keras_closed_before_its_assign_is_read_from_the_shard_again(
        tmp_path: Path, unread_reads: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    """Keras' sharded store reads a value of another shard, then closes that shard and goes back
    to its own before the layer assigns the value: the unread value opens the shard again."""
    saved = trained_model(24)
    path = sharded_weights(saved, tmp_path)
    assert len(list(tmp_path.glob("model_*.weights.h5"))) > 4
    loaded = trained_model(25)
    keras_assigns(loaded, monkeypatch)
    assert compat.load_sharded_weights(loaded, str(path), lambda name: None)
    assert sorted(unread_reads) == sorted(variable_buffers(loaded).values())
    for before, after in zip(saved.variables + saved.optimizer.variables,
                             loaded.variables + loaded.optimizer.variables, strict=True):
        assert np.array_equal(numpy(before), numpy(after)), after.path


class KeepsItsValue(keras.layers.Layer):
    """A layer that keeps what its store hands it, as Keras' Discretization keeps its summary."""

    def build(self, input_shape: tuple[int, ...]) -> None:
        self.kernel = self.add_weight(shape=(input_shape[-1], 5), initializer="ones")

    def call(self, inputs: object) -> object:
        return keras.ops.matmul(inputs, self.kernel)

    def load_own_variables(self, store: object) -> None:
        self.kept = store["0"]  # type: ignore[index]
        self.kernel.assign(self.kept)


@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="TensorFlow's unread values")
@pytest.mark.parametrize("layout", ["one file", "shards"])
def test_a_value_a_layer_keeps_is_read_before_its_file_closes(layout: str, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from resumable.keras.compat import in_place_reads

    if keras_version() < (3, 10):
        pytest.skip("Keras 3.8 and 3.9 hand a layer the h5py dataset itself, closed with its file, "
                    "whichever load runs: resumable's store is Keras 3.10's")
    monkeypatch.setattr(in_place_reads, "UNREAD_FROM_BYTES", 1)

    def model() -> keras.Model:
        built = keras.Sequential([keras.Input((4,)), KeepsItsValue(), keras.layers.Dense(2)])
        built.compile(optimizer="adam", loss="mse")
        built.optimizer.build(built.trainable_variables)
        return built

    saved = model()
    saved.layers[0].kernel.assign(np.arange(20, dtype="float32").reshape(4, 5))
    loaded = model()
    if layout == "one file":
        saved.save_weights(str(tmp_path / "model.weights.h5"))
        load(loaded, tmp_path / "model.weights.h5")  # a file object, closed once loaded
    else:
        path = sharded_weights(saved, tmp_path)
        assert compat.load_sharded_weights(loaded, str(path), lambda name: None)
        for shard in tmp_path.glob("model_*.weights.h5"):
            shard.unlink()  # a later prune: the kept value must not need its file
    kept = loaded.layers[0].kept
    assert isinstance(kept, in_place_reads.UnreadValue)
    assert np.array_equal(np.asarray(kept), np.arange(20, dtype="float32").reshape(4, 5))
