"""A worker that reports the EngineCore process's ``sys.modules``: in a module of its own that
imports nothing of the frontend, so that loading it in the core adds no frontend module."""

from __future__ import annotations

import sys

from engine.worker import Worker, rpc_method


class ModulesWorker(Worker):
    @rpc_method
    def loaded_modules(self) -> list:
        return sorted(sys.modules)
