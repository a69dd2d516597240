"""The install promises: no hard TensorFlow requirement, no TensorFlow import for storage and CLI."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import requires


def test_tensorflow_is_only_an_extra() -> None:
    # Colab's TPU runtimes ship without TensorFlow and installing it there breaks their JAX.
    hard = [r for r in requires("keras-resumable") or [] if "extra ==" not in r]
    assert hard, "resumable declares no requirements at all"
    assert not [r for r in hard if r.lower().startswith("tensorflow")]
    assert any(r.startswith("keras") for r in hard)


def test_storage_and_cli_do_not_import_tensorflow_or_keras() -> None:
    code = (
        "import sys, resumable, resumable.storage, resumable.cli.app, resumable.core.policy\n"
        "heavy = sorted(m for m in ('tensorflow', 'keras', 'jax') if m in sys.modules)\n"
        "print(','.join(heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
