"""The Keras internals resumable relies on, reached from here only.

Keras exports no API for these. Each is probed once per process; when a Keras version lacks it
or it does not behave as resumable needs, resumable falls back to Keras' public API or to what
plain Keras does, and says so once in one line naming the Keras version (`messages`): an
unknown Keras costs exactness or speed, never a save or a resume. Callers write
``from resumable.keras import compat`` and ``compat.<name>``. Every internal reached, by module:

- `global_state`: ``keras.src.utils.module_utils.tensorflow._available`` (the lazy TensorFlow
  module's cached answer); ``keras.src.backend.common.global_state.get_global_attribute``,
  ``keras.src.random.seed_generator.global_seed_generator`` and ``GLOBAL_SEED_GENERATOR``.
- `fit`: ``keras.src.trainers.data_adapters``' ``array_data_adapter.ArrayDataAdapter`` (its
  ``get_tf_dataset``, ``get_numpy_iterator``, ``get_torch_dataloader``), ``can_convert_arrays``,
  ``array_slicing.train_validation_split``; the ``keras.callbacks.CallbackList`` and ``x`` in
  ``fit``'s frame; ``Trainer._symbolic_build(data_batch=...)``; ``Trainer._initial_epoch``; the
  ``epoch_iterator``'s ``_num_batches`` in ``fit``'s frame (a pass's length); how
  ``EpochIterator._enumerate_iterator`` creates a dataset's iterators (modelled, not reached).
- `callbacks`: ``keras.callbacks.TensorBoard._global_train_batch``, ``_global_test_batch``,
  ``_writers``; ``keras.callbacks.ModelCheckpoint._save_model``, ``_get_file_path``,
  ``_should_save_model`` (Keras 3.10+; before, its decision is made here as those versions
  make it), ``monitor_op``, ``best`` (the methods' parameters are checked);
  ``keras.src.utils.io_utils.print_msg`` (Keras 3.8 and 3.9's save lines); whether
  ``_save_model``'s source prints "finished saving" (Keras 3.13 does, 3.8 and 3.10 do not).
- `variables` (trainable-only checkpoints and LoRA): ``Layer._layers``, ``_flatten_layers``,
  ``_trainable_variables``, ``_non_trainable_variables``.
- `saving_lib`, `stores`, `saving` (snapshots written in the background), `loading` (fast
  loads), `in_place_reads` (its store's reads) and `probing`: ``keras.src.saving.saving_lib``'s
  ``_save_state``, ``_load_state``, ``_raise_loading_failure``, ``_serialize_model_as_json``,
  ``_model_from_config``,
  ``H5IOStore`` (``make``, ``__setitem__``, ``_get_h5_file``; an entry object from ``make`` in
  Keras 3.8 and 3.9; for reads, ``__getitem__`` and its ``_h5_entry_group``),
  ``ShardedH5IOStore`` (``_get_h5_file``), ``DiskIOStore``;
  ``keras.src.saving.keras_saveable.KerasSaveable`` (the probes' saveable); an optimizer's
  ``save_own_variables`` stood in for during a snapshot. Probed by round trips of a tiny
  saveable (`snapshots_work`, `sharding_works`, `loading._loading_works`), not by names alone.
- `in_place` (a load a variable at a time): each variable's ``assign``, overridden on the
  variable itself for one load, its ``_value``, ``_dtype`` and ``_layout``;
  ``keras.src.backend.common.stateless_scope.in_stateless_scope``; on TensorFlow, an eager
  tensor's ``_numpy`` (its CPU buffer, written into).
- `deferred_init` (a model built from a checkpoint's config for its load, on JAX):
  ``keras.Variable._initialize_with_initializer`` (replaced while the model is built, on the
  building thread), ``_initialize``, ``_value``, ``_shape``, ``_dtype``;
  ``keras.src.backend.common.global_state``'s ``distribution``; ``keras.config.is_nnx_enabled``.
- `keras_backup` (the backup `resume()` adopts): ``keras.callbacks.BackupAndRestore``'s
  ``_weights_path``, ``_training_metadata_path``, ``_prev_weights_path`` and
  ``_prev_training_metadata_path`` (the names of its files).
- `legacy_h5` (Keras 2's HDF5 files): ``keras.src.legacy.saving.legacy_h5_format``'s
  ``save_weights_to_hdf5_group`` and ``save_optimizer_weights_to_hdf5_group``;
  ``Model._compile_config``.
"""

from resumable.keras.compat.callbacks import (
    TENSORBOARD_COUNTERS,
    flush_tensorboard,
    model_checkpoint_internals,
    says_finished_saving,
    should_save_model,
)
from resumable.keras.compat.fit import (
    ArrayAdapters,
    array_adapters,
    build_for_fit,
    dataset_iterators_per_pass,
    fit_reads_to_build,
    pydataset_epoch_order,
    running_fit_callbacks,
    running_fit_input,
    set_fit_initial_epoch,
    set_fit_pass_length,
)
from resumable.keras.compat.global_state import global_seed_generator, tensorflow_unavailable
from resumable.keras.compat.in_place import assigned_in_place, shared_buffer
from resumable.keras.compat.keras_backup import BackupNames, backup_names
from resumable.keras.compat.legacy_h5 import (
    can_write_legacy_weights,
    compile_config_kept,
    write_legacy_weights,
)
from resumable.keras.compat.loading import (
    load_keras_archive,
    load_sharded_weights,
    load_unzipped_model,
    load_weights_from,
    sharding_works,
)
from resumable.keras.compat.messages import unsupported
from resumable.keras.compat.saving import can_shard, model_json, saved_values, snapshots_work
from resumable.keras.compat.stores import SavedValue, write_sharded_weights, write_weights
from resumable.keras.compat.variables import lora_layer_variables, trained_non_trainable_variables

__all__ = ["array_adapters", "ArrayAdapters", "assigned_in_place", "backup_names", "BackupNames",
           "build_for_fit", "can_shard", "can_write_legacy_weights", "compile_config_kept",
           "dataset_iterators_per_pass", "fit_reads_to_build", "flush_tensorboard", "global_seed_generator",
           "load_keras_archive", "load_sharded_weights", "load_unzipped_model", "load_weights_from",
           "lora_layer_variables", "model_checkpoint_internals", "model_json",
           "pydataset_epoch_order", "running_fit_callbacks",
           "running_fit_input", "saved_values", "SavedValue", "says_finished_saving", "set_fit_initial_epoch",
           "set_fit_pass_length",
           "shared_buffer", "sharding_works", "should_save_model", "snapshots_work", "TENSORBOARD_COUNTERS",
           "tensorflow_unavailable", "trained_non_trainable_variables", "unsupported", "write_legacy_weights",
           "write_sharded_weights", "write_weights"]
