"""`resumable inspect`: one checkpoint's manifest, metrics, files and recorded state."""

from __future__ import annotations

import json
from typing import Any

from resumable.cli import adoptable, tiers
from resumable.cli.common import EXIT_OK, load_run, select_checkpoint
from resumable.cli.output import fmt_float, info_json, out, out_json, out_lines, out_section, plural
from resumable.core.display import format_table, human_size, utc_time
from resumable.core.manifest import MANIFEST_NAME
from resumable.storage import CheckpointInfo

STATE_WIDTH = 100  # a state value longer than this, as JSON, is cut short


def run_inspect(url: str, *, epoch: int | None = None, name: str | None = None, as_json: bool = False,
                local_tier: str | None = None) -> int:
    """Print one checkpoint (by ``name``, else of ``epoch``, else the latest good); return the exit code.

    A ``name`` the run folder lacks is looked for in the run's local tier (#55: under ``local_tier``,
    else the default place)."""
    storage, infos = load_run(url)
    tier = tiers.DURABLE
    if name is not None and all(i.name != name for i in infos):
        local, local_infos = tiers.local_checkpoints(storage, local_tier, check_files=True)
        if local is not None and any(i.name == name for i in local_infos):
            storage, infos, tier = local, local_infos, tiers.LOCAL
    info = select_checkpoint(storage, infos, epoch, name)
    if as_json:
        out_json({**info_json(info), "tier": tier, "manifest": _manifest_json(info)})
        return EXIT_OK
    fields: list[tuple[str, str]] = [
        ("checkpoint", info.name), ("tier", tier), ("url", info.url), ("status", _status_text(info)),
    ]
    manifest = info.manifest
    if manifest is not None:
        fields += [
            ("epoch", str(manifest.epoch)),
            ("step", str(manifest.step)),
            ("batch", f"{manifest.batch} (mid-epoch save)" if manifest.batch else "0 (end of epoch)"),
            ("created", utc_time(info.created_iso)),
            # as `list` and `verify` count it: every file stored, the manifest included
            ("size", f"{human_size(info.size)}: {plural(len(manifest.files), 'file')} and the manifest"),
            ("versions", ", ".join(f"{k} {v}" for k, v in manifest.versions.items()) or "-"),
            ("format", str(manifest.format_version)),
        ]
    out_lines(format_table(["", ""], fields, header=False))
    if manifest is not None and manifest.metrics:
        metrics = [(k, fmt_float(v)) for k, v in manifest.metrics.items()]
        out_section("metrics", format_table(["", ""], metrics, header=False))
    out_section("files", _file_table(info))
    if manifest is not None and manifest.state:
        out_section("state", _state_lines(manifest.state))
        out("")
        out(f"full manifest: resumable inspect {storage.url} --name {info.name} --json")
    return EXIT_OK


def _status_text(info: CheckpointInfo) -> str:
    problem = adoptable.problem_text(info)
    return f"{adoptable.status_text(info)}: {problem}" if problem else str(info.status)


def _file_table(info: CheckpointInfo) -> list[str]:
    expected = info.manifest.files if info.manifest else {}
    unlisted = "Orbax's (no manifest)" if adoptable.is_orbax_step(info) else "not in the manifest"
    rows = []
    for rel, entry in expected.items():
        listed = info.listed.get(rel)
        if listed is None:
            check = "missing"
        elif listed.size != entry.size:
            check = f"stored size {human_size(listed.size)}"
        elif listed.crc32c is not None and listed.crc32c != entry.crc32c:
            check = f"stored crc32c {listed.crc32c}"
        else:
            check = "ok" if listed.crc32c else "ok (size)"
        rows.append([rel, human_size(entry.size), entry.crc32c, check])
    for rel, listed in sorted(info.listed.items()):
        if rel not in expected and rel != MANIFEST_NAME:
            rows.append([rel, human_size(listed.size), "-", unlisted])
    return format_table(["PATH", "SIZE", "CRC32C", "LISTING"], rows, right={1})


def _state_lines(state: dict[str, Any], width: int = STATE_WIDTH) -> list[str]:
    """Top-level state keys, and one level below them, as compact JSON cut to ``width``."""
    rows: list[tuple[str, str]] = []
    for key, value in state.items():
        if isinstance(value, dict) and value:
            rows.append((key, ""))
            rows += [(f"  {sub}", _short_json(v, width)) for sub, v in value.items()]
        else:
            rows.append((key, _short_json(value, width)))
    return format_table(["", ""], rows, header=False)


def _short_json(value: Any, width: int) -> str:
    text = json.dumps(value, separators=(", ", ": "), default=str)
    return text if len(text) <= width else text[: width - 3] + "..."


def _manifest_json(info: CheckpointInfo) -> dict[str, Any] | None:
    if info.manifest is None:
        return None
    parsed: dict[str, Any] = json.loads(info.manifest.to_json())
    return parsed
