"""The path of a save, measured: which of the package's files one epoch and its save run through.

A small model trains two epochs through ``resume()`` + ``run.fit`` into a local run folder.
Once the first epoch's save is committed, from the start of the second epoch until ``run.fit``
returns (its save committed), every call of a function of the ``resumable`` package, in every
thread, is recorded (``sys.setprofile`` and ``threading.setprofile``, installed before
``resume()`` so that the uploader's and the lease's threads carry it too). From that trace:

- **files on the path**: the package's files whose functions ran;
- **links**: distinct (caller file, callee file) pairs, the caller being the nearest frame of
  the package up the stack;
- **files per thread**: by thread name;
- **once per fit**: of the files on the path, those entered only in training's thread once the
  fit ends (from Keras' ``on_train_end`` until ``run.fit`` returns: the last uploads waited for,
  the lease given back, the context managers ``run.fit`` entered before the fit exited). They are
  on the path because the trace runs until ``run.fit`` returns, not because of the epoch or its
  save; ``per epoch and save`` counts the others;
- **layer climbs**: calls whose caller is in a lower layer than the callee
  (core < storage < manager < keras, cli). A call through an interface the lower layer
  declares (a method of a ``typing.Protocol`` class defined in the calling module, such as the
  manager's ``listener.SaveListener`` or policy's ``CheckpointLike``) is how a lower layer is
  meant to reach what a higher one hands it, and is counted apart, as ``interface calls``.

And from the source (``ast``), the whole package:

- **forwarding methods**: a method whose body (its docstring aside) is one statement that
  calls, or returns the call of, a method of an attribute of ``self`` (``self.a.m(...)``,
  ``self.a.b.m(...)``), or returns an attribute of an attribute of ``self`` of its own name
  (a property handed on);
- the largest classes and modules, by lines.

Usage::

    python benchmarks/save_path.py            # the figures, then the targets met or not
    python benchmarks/save_path.py --json     # the same as one JSON object
    python benchmarks/save_path.py --source   # the source figures alone (no training)
"""

from __future__ import annotations

import argparse
import ast
import collections
import functools
import json
import os
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "resumable"
LAYERS = {"core": 0, "storage": 1, "manager": 2, "keras": 3, "cli": 3}

# The targets of issue #53.
TARGETS = {"files": 30, "climbs": 0, "forwarding": 45, "class_lines": 300, "module_lines": 450}


@functools.cache
def protocol_members(rel: str) -> frozenset[str]:
    """The member names of the ``typing.Protocol`` classes module ``rel`` defines."""
    members: set[str] = set()
    for node in ast.walk(ast.parse((ROOT / rel).read_text())):
        if isinstance(node, ast.ClassDef) and any(
                (isinstance(b, ast.Name) and b.id == "Protocol") or (isinstance(b, ast.Attribute)
                                                                    and b.attr == "Protocol")
                for b in node.bases):
            members |= {m.name for m in node.body if isinstance(m, ast.FunctionDef)}
    return frozenset(members)


def layer_of(rel: str) -> int | None:
    parts = rel.split("/")
    return LAYERS.get(parts[1]) if len(parts) > 2 else None


# ------------------------------------------------------------------ the trace


def trace_save() -> dict[str, Any]:
    """Train two epochs, tracing the second and its save; the trace's figures."""
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import keras
    import numpy as np

    import resumable

    package = str(PACKAGE) + os.sep
    recording = threading.Event()
    fit_ending = threading.Event()  # Keras' on_train_end called: the fit's end, not its epoch
    main = threading.main_thread()
    calls: collections.Counter[tuple[str, str, str, str]] = collections.Counter()
    at_fit_end: set[str] = set()  # files entered in training's thread once the fit ends
    before_fit_end: set[str] = set()  # files entered in any thread before, or in another thread
    rel_of: dict[str, str | None] = {}

    def rel(filename: str) -> str | None:
        found = rel_of.get(filename, "")
        if found == "":
            found = rel_of[filename] = (os.path.relpath(filename, ROOT).replace(os.sep, "/")
                                        if filename.startswith(package) else None)
        return found

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event != "call" or not recording.is_set():
            return
        in_main = threading.current_thread() is main
        if in_main and frame.f_code.co_name == "on_train_end" and not fit_ending.is_set():
            fit_ending.set()  # Keras' CallbackList.on_train_end, before any callback's own
        callee = rel(frame.f_code.co_filename)
        if callee is None:
            return
        (at_fit_end if in_main and fit_ending.is_set() else before_fit_end).add(callee)
        caller, back, depth = None, frame.f_back, 0
        while back is not None and depth < 12:  # the nearest frame of the package up the stack
            caller = rel(back.f_code.co_filename)
            if caller is not None:
                break
            back, depth = back.f_back, depth + 1
        calls[(threading.current_thread().name, caller or "", callee, frame.f_code.co_name)] += 1

    class StartRecording(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            if epoch == 1:
                # the first epoch's save committed first: its upload would run on into the trace,
                # and a run's first commit does what later ones do not (the run index written new)
                run.callback.wait_for_uploads()
                recording.set()

    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 8)).astype("float32")
    y = rng.normal(size=(64, 1)).astype("float32")

    def build() -> keras.Model:
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                                  keras.layers.Dense(1)])
        model.compile(optimizer="adam", loss="mse")
        return model

    with tempfile.TemporaryDirectory() as tmp:
        threading.setprofile(profile)
        sys.setprofile(profile)
        try:
            run = resumable.resume(os.path.join(tmp, "run"), build, staging_dir=os.path.join(tmp, "staging"))
            run.fit(x, y, epochs=2, batch_size=16, verbose=0, callbacks=[StartRecording()])
        finally:
            recording.clear()
            sys.setprofile(None)
            threading.setprofile(None)  # type: ignore[arg-type]

    files = sorted({callee for (_, _, callee, _) in calls})
    links = sorted({(caller, callee) for (_, caller, callee, _) in calls if caller and caller != callee})
    per_thread: dict[str, set[str]] = collections.defaultdict(set)
    for thread, _, callee, _ in calls:
        per_thread[thread].add(callee)
    climbs, interface = set(), set()
    for _, caller, callee, function in calls:
        low, high = layer_of(caller) if caller else None, layer_of(callee)
        if low is not None and high is not None and low < high:
            through = function in protocol_members(caller)
            (interface if through else climbs).add(f"{caller} -> {callee}:{function}")
    return {"files": files, "once_per_fit": sorted(at_fit_end - before_fit_end),
            "links": [f"{a} -> {b}" for a, b in links],
            "threads": {name: sorted(found) for name, found in sorted(per_thread.items())},
            "climbs": sorted(climbs), "interface_calls": sorted(interface)}


# ------------------------------------------------------------------ the source


def _chain_from_self(node: ast.expr) -> list[str] | None:
    """``self.a.b.m`` -> ["a", "b", "m"]; None when not rooted at ``self``."""
    names = []
    while isinstance(node, ast.Attribute):
        names.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name) and node.id == "self":
        return names[::-1]
    return None


def is_forwarding(method: ast.FunctionDef) -> bool:
    body = list(method.body)
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        body = body[1:]  # the docstring
    if len(body) != 1 or not isinstance(body[0], ast.Return | ast.Expr) or body[0].value is None:
        return False
    value = body[0].value
    if isinstance(value, ast.Call):
        chain = _chain_from_self(value.func)
        return chain is not None and len(chain) >= 2
    chain = _chain_from_self(value)
    handed_on = chain is not None and len(chain) >= 2 and chain[-1] == method.name
    return isinstance(body[0], ast.Return) and handed_on


def source_figures() -> dict[str, Any]:
    forwarding: dict[str, list[int]] = {}
    classes, modules = [], []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        text = path.read_text()
        modules.append((len(text.splitlines()), rel))
        for node in ast.walk(ast.parse(text)):
            if not isinstance(node, ast.ClassDef):
                continue
            classes.append((node.end_lineno - node.lineno + 1, f"{rel}:{node.name}"))  # type: ignore[operator]
            methods = [m for m in node.body if isinstance(m, ast.FunctionDef)]
            found = sum(is_forwarding(m) for m in methods)
            if found:
                forwarding[f"{rel}:{node.name}"] = [found, len(methods)]
    return {"forwarding": sum(f for f, _ in forwarding.values()),
            "forwarding_by_class": dict(sorted(forwarding.items(), key=lambda kv: -kv[1][0])),
            "largest_classes": sorted(classes, reverse=True)[:5],
            "largest_modules": sorted(modules, reverse=True)[:5]}


def verdicts(figures: dict[str, Any]) -> dict[str, bool]:
    found = {"forwarding": figures["forwarding"] <= TARGETS["forwarding"],
             "class_lines": figures["largest_classes"][0][0] <= TARGETS["class_lines"],
             "module_lines": figures["largest_modules"][0][0] <= TARGETS["module_lines"]}
    if "files" in figures:
        found["files"] = len(figures["files"]) <= TARGETS["files"]
        found["climbs"] = len(figures["climbs"]) <= TARGETS["climbs"]
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="one JSON object")
    parser.add_argument("--source", action="store_true", help="the source figures alone (no training)")
    args = parser.parse_args()
    figures = source_figures() if args.source else {**trace_save(), **source_figures()}
    figures["met"] = verdicts(figures)
    if args.json:
        print(json.dumps(figures, indent=1))
        return
    if not args.source:
        files, once = figures["files"], figures["once_per_fit"]
        print(f"files on the path: {len(files)} ({len(files) - len(once)} per epoch and save, "
              f"{len(once)} once per fit: entered only as the fit ends)")
        for name in once:
            print(f"  once per fit: {name}")
        print(f"file-to-file links: {len(figures['links'])}")
        for name, found in figures["threads"].items():
            print(f"  thread {name}: {len(found)} files")
        print(f"layer climbs: {len(figures['climbs'])}")
        for line in figures["climbs"]:
            print(f"  {line}")
        print(f"interface calls: {len(figures['interface_calls'])}")
        for line in figures["interface_calls"]:
            print(f"  {line}")
    print(f"forwarding methods: {figures['forwarding']}")
    for name, (found, total) in list(figures["forwarding_by_class"].items())[:6]:
        print(f"  {name}: {found} of {total}")
    for kind in ("classes", "modules"):
        largest = figures[f"largest_{kind}"][:3]
        print(f"largest {kind}: " + ", ".join(f"{name} {lines}" for lines, name in largest))
    met = figures["met"].items()
    print("targets: " + ", ".join(f"{name} {'met' if ok else 'NOT met'}" for name, ok in met))


if __name__ == "__main__":
    main()
