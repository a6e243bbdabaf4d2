"""Whether ``instrument()`` names otel-train's NCCL profiler plugin to NCCL, and the
settings it hands the plugin (``nccl_plugin``: auto, true, false; docs/collectives.md)."""

from __future__ import annotations

import os
from typing import Any

import torch

from otel_train import config as config_mod
from otel_train import nccl
from otel_train.sources.collectives.flight_recorder import (
    FlightRecorder,
)


def _nccl_groups_bound() -> bool:
    """Has an NCCL process group created its communicators already (eager initialisation,
    ``init_process_group(device_id=...)``)? NCCL then loaded its profiler plugin, or failed
    to, and never tries again in this process."""
    from otel_train.sources.collectives.flight_recorder import nccl_groups

    return any(getattr(g, "bound_device_id", None) is not None for g in nccl_groups())


#: the plugin exports NCCL's ncclProfiler_v5 interface, which NCCL looks up from 2.28
_MIN_NCCL = (2, 28)


def _nccl_version() -> tuple[int, ...] | None:
    try:
        version = torch.cuda.nccl.version()
    except Exception:  # no NCCL in this torch build
        return None
    return tuple(version) if isinstance(version, tuple) else None


def _nccl_ran() -> bool | None:
    """Has any NCCL operation run in this process (then NCCL has created a communicator,
    tried to load a profiler plugin, and never tries again)? From the flight recorder's
    entries; None when it cannot be told (no flight recorder)."""

    recorder = FlightRecorder(world_size=1)
    if not recorder.available():
        return None
    recorder.baseline()
    if recorder.errors:
        return None
    return recorder.highest is not None and recorder.highest >= 0


def auto_declines(version: tuple[int, ...] | None, bound: bool, ran: bool | None,
                  world_size: int = 2) -> str | None:
    """Why ``nccl_plugin="auto"`` leaves NCCL to the flight recorder, or None to name the
    plugin: NCCL too old for its interface, communicators made already (eagerly, or by an
    operation that ran), no way to tell, or a world of one rank (NCCL runs a one-rank
    communicator's operations without calling its profiler, as seen on an H200)."""
    if world_size < 2:
        return "one rank: NCCL runs one-rank communicators without its profiler plugin"
    if version is None or version[:2] < _MIN_NCCL:
        return (f"NCCL {'.'.join(map(str, version)) if version else 'unknown'} is older "
                f"than {'.'.join(map(str, _MIN_NCCL))}")
    if bound:
        return "NCCL communicators existed before instrument() (init_process_group(device_id=...))"
    if ran is None:
        return "cannot tell whether NCCL made its communicators already (no flight recorder)"
    if ran:
        return "NCCL operations ran before instrument()"
    return None


def _name_the_plugin(log: Any, cfg: config_mod.Config) -> None:
    """Name otel-train's NCCL plugin in ``NCCL_PROFILER_PLUGIN`` while NCCL can still load it
    (no NCCL communicator yet); built with the system's C compiler on first use. With
    ``nccl_plugin="auto"``: only where it surely loads (:func:`auto_declines`), and quietly
    otherwise: the flight recorder is the source then, as it always was. Where the plugin is
    ours, its variables are set to the checked settings (``config.nccl_environment``)."""
    from otel_train.sources.collectives.flight_recorder import nccl_groups

    auto = cfg.nccl_plugin == "auto"
    if not nccl_groups():
        return
    if nccl.ours(os.environ.get(nccl.ENV_NCCL)):  # the launcher named it
        os.environ.update(config_mod.nccl_environment(cfg))
        return
    hint = f"set {nccl.ENV_NCCL}=$(otel-train nccl-plugin) in the launcher"
    if os.environ.get(nccl.ENV_NCCL):
        log.info("otel_train.nccl_plugin", used=False,
                 reason=f"{nccl.ENV_NCCL} names another plugin")
        return
    if auto:
        import torch.distributed as dist

        reason = auto_declines(_nccl_version(), _nccl_groups_bound(), _nccl_ran(),
                               dist.get_world_size() if dist.is_initialized() else 2)
        if reason is not None:
            log.info("otel_train.nccl_plugin", used=False, reason=reason,
                     source="nccl_flight_recorder", hint=hint)
            return
    elif _nccl_groups_bound():
        log.info("otel_train.nccl_plugin", used=False,
                 reason=f"NCCL communicators existed before instrument(); {hint}")
        return
    try:
        named = nccl.name_to_nccl()
    except nccl.PluginUnavailable as err:
        (log.info if auto else log.warning)("otel_train.nccl_plugin", used=False,
                                            reason=str(err), source="nccl_flight_recorder")
        return
    # what the plugin's C code reads when NCCL loads it: the checked settings
    os.environ.update(config_mod.nccl_environment(cfg))
    log.info("otel_train.nccl_plugin", used=True, named=named, auto=auto)


