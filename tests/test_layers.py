"""The package's layers, read from its imports: they point one way and form no circle.

core <- storage <- manager <- keras, cli; the Keras side reaches storage only through the
manager. Read with `ast`, so a lazy import inside a function counts as much as one at the top
of a module.
"""

from __future__ import annotations

import ast
from pathlib import Path

from parsing import parse
from paths import ROOT

PACKAGE = ROOT / "resumable"

# What each layer may import from the package, besides itself.
ALLOWED = {
    "core": set(),
    "storage": {"core"},
    "manager": {"core", "storage"},
    "keras": {"core", "manager"},  # storage's names through the manager's public ones (manager/__init__.py)
    "cli": {"core", "storage", "manager"},
}
# The CLI's `demo` command trains a model as a user would (`import resumable`): it alone may
# reach the Keras side and the package's face.
EXCEPTIONS = {("cli", "demo.py"): {"keras", "face"}}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """The resumable modules ``path`` imports (a ``from x import y`` counts y when y is a module)."""
    found = set()
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    for node in ast.walk(parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*package.split(".")[: len(package.split(".")) - node.level + 1], base])
            for alias in node.names:
                candidate = f"{base}.{alias.name}"
                found.add(candidate if (ROOT / candidate.replace(".", "/")).with_suffix(".py").exists()
                          or (ROOT / candidate.replace(".", "/")).is_dir() else base)
    return {name for name in found if name == "resumable" or name.startswith("resumable.")}


def graph() -> dict[str, set[str]]:
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {name: {i for i in imports_of(path) if i in modules and i != name}
            for name, path in modules.items()}


def layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in ALLOWED) else None


def violations(edges: dict[str, set[str]]) -> list[str]:
    """Imports that run against the layers, as ``a -> b``."""
    wrong = []
    for module, targets in sorted(edges.items()):
        here = layer(module)
        if here is None:
            continue  # resumable/__init__.py, __main__.py, _version.py: the package's face
        allowed = ALLOWED[here] | {here} | EXCEPTIONS.get((here, module.rsplit(".", 1)[-1] + ".py"), set())
        for target in sorted(targets):
            there = "face" if target == "resumable" else layer(target)
            if there is not None and there not in allowed:
                wrong.append(f"{module} -> {target}")
    return wrong


def circles(edges: dict[str, set[str]]) -> list[str]:
    """Every import circle found by a depth-first walk, as ``a -> b -> a``."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    found = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for target in sorted(edges.get(node, ())):
            if state.get(target) == 1:
                found.append(" -> ".join([*path[path.index(target):], target]))
            elif target not in state:
                visit(target, [*path, target])
        state[node] = 2

    for start in sorted(edges):
        if start not in state:
            visit(start, [start])
    return found


def test_layers_point_one_way() -> None:
    assert violations(graph()) == []


def test_no_import_circle() -> None:
    assert circles(graph()) == []


def keras_groups(edges: dict[str, set[str]]) -> dict[str, set[str]]:
    """The Keras side's imports between its sub-packages (callback, checkpoint, replay, ...) and its
    top modules (run, topology): each module folded into the group it belongs to."""
    def group(module: str) -> str | None:
        parts = module.split(".")
        return parts[2] if parts[:2] == ["resumable", "keras"] and len(parts) > 2 else None

    folded: dict[str, set[str]] = {}
    for module, targets in edges.items():
        if (here := group(module)) is not None:
            folded.setdefault(here, set()).update(
                there for t in targets if (there := group(t)) is not None and there != here)
    return folded


def test_the_keras_sub_packages_import_one_way() -> None:
    # callback/ builds on checkpoint/, replay/ and multihost/; resuming/ and dropins/ on those; run.py
    # on all: a reader can take the sub-packages from the bottom up.
    groups = keras_groups(graph())
    assert {"callback", "checkpoint", "replay", "resuming", "dropins", "multihost", "compat"} <= set(groups)
    assert circles(groups) == []


def test_the_checks_find_a_wrong_way_import_and_a_circle() -> None:
    edges = {"resumable.core.a": {"resumable.keras.b"}, "resumable.keras.b": {"resumable.core.a"},
             "resumable.storage.c": {"resumable.core.a"}, "resumable.keras.d": {"resumable.storage.c"}}
    assert violations(edges) == ["resumable.core.a -> resumable.keras.b",
                                 "resumable.keras.d -> resumable.storage.c"]
    assert circles(edges) == ["resumable.core.a -> resumable.keras.b -> resumable.core.a"]
    folded = keras_groups({"resumable.keras.saving.a": {"resumable.keras.callback.b"},
                           "resumable.keras.callback.b": {"resumable.keras.saving.c"}})
    assert circles(folded) == ["callback -> saving -> callback"]
    assert "resumable.core.manifest" in graph()["resumable.storage.commit" if "resumable.storage.commit"
                                                in graph() else "resumable.storage.run_storage"]


# The callback and the parts it is built from (#33): only these may touch its private fields.
CALLBACK_PARTS = {f"callback/{name}.py" for name in ("checkpoint_callback", "save_options", "save_schedule",
                                                      "checkpoint_builder", "commit_lines", "fit_position")}


def callback_private_names() -> set[str]:
    """The ``_names`` CheckpointCallback defines: its methods and the fields its methods assign."""
    tree = parse((PACKAGE / "keras" / "callback" / "checkpoint_callback.py").read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "CheckpointCallback")
    names = set()
    for node in ast.walk(cls):
        if isinstance(node, ast.FunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and isinstance(
                node.value, ast.Name) and node.value.id == "self":
            names.add(node.attr)
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


def private_uses(source: str, private: set[str]) -> list[str]:
    """``line: .name`` for each attribute of ``source`` read or written that is one of ``private``
    (``self._x`` only in a subclass of CheckpointCallback: elsewhere ``self`` is another object)."""
    tree = parse(source)
    own = set()  # self._x of classes that are not the callback's
    for cls in ast.walk(tree):
        if isinstance(cls, ast.ClassDef) and not any(
                isinstance(base, ast.Name) and base.id == "CheckpointCallback" for base in cls.bases):
            own |= {id(n) for n in ast.walk(cls) if isinstance(n, ast.Attribute)
                    and isinstance(n.value, ast.Name) and n.value.id == "self"}
    return [f"{node.lineno}: .{node.attr}" for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and node.attr in private and id(node) not in own]


def test_only_the_callback_and_its_parts_touch_its_private_fields() -> None:
    # Run, resume's restore, BackupAndRestore (a subclass), the drop-ins and the signal handlers
    # use the callback's public methods (restore, forget_run, start_over, ...).
    private = callback_private_names()
    assert {"_siblings", "_last", "_start"} <= private
    keras_side = PACKAGE / "keras"
    found = {name: uses for path in sorted(keras_side.rglob("*.py"))
             if (name := path.relative_to(keras_side).as_posix()) not in CALLBACK_PARTS
             and (uses := private_uses(path.read_text(), private))}
    assert found == {}


def test_the_private_field_check_finds_a_field_written_from_outside() -> None:
    private = callback_private_names()
    source = ("def roll_back(run):\n    run.callback._siblings = []\n"
              "class Backup(CheckpointCallback):\n    def forget(self):\n        self._last = None\n"
              "class Feed:\n    def end(self):\n        self._siblings = 0\n")
    assert private_uses(source, private) == ["2: ._siblings", "5: ._last"]
