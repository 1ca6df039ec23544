"""Model runners with injected faults, for the failure tests. The EngineCore process imports
them by name (``worker_cls``), so they live at the top level of this importable module."""
from __future__ import annotations

from engine.core.sched_output import ModelRunnerOutput, SchedulerOutput
from engine.worker.model_runner import ModelRunner

# A prompt holding this token id makes its step fail (no other test prompt uses it).
POISON = 4321
# What the injected exception says: a local path, which must never reach a client.
FAULT_TEXT = "injected fault in /secret/site-packages/kernel.py"


class FaultyRunner(ModelRunner):
    """Raises in any step whose batch holds a request with POISON in its prompt."""

    def execute_model(self, so: SchedulerOutput) -> ModelRunnerOutput:
        if any(POISON in req.prompt_token_ids for req in so.requests):
            raise RuntimeError(FAULT_TEXT)
        return super().execute_model(so)


class BrokenRunner(ModelRunner):
    """Every step that runs a request raises: a device that no longer works."""

    def execute_model(self, so: SchedulerOutput) -> ModelRunnerOutput:
        if so.requests:
            raise RuntimeError(FAULT_TEXT)
        return super().execute_model(so)


class NotARunner:
    """Has the method but is no ModelRunner: refused as a worker_cls."""

    def execute_model(self, so: SchedulerOutput) -> ModelRunnerOutput:
        return ModelRunnerOutput()
