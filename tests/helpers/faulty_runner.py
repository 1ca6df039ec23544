"""Workers with injected faults, for the failure tests. Top-level classes of an importable
module, so both forms of ``worker_cls`` work: the class (cloudpickled by reference) and its
dotted path ``tests.helpers.faulty_runner.FaultyWorker`` (``ringllm serve --worker-cls``)."""

from __future__ import annotations

from engine.core.sched_output import ModelRunnerOutput, SchedulerOutput
from engine.worker import Worker

# A prompt holding this token id makes its step fail (no other test prompt uses it).
POISON = 4321
# What the injected exception says: a local path, which must never reach a client.
FAULT_TEXT = "injected fault in /secret/site-packages/kernel.py"


class FaultyWorker(Worker):
    """Raises in any step whose batch holds a request with POISON in its prompt."""

    def execute_model(self, so: SchedulerOutput) -> ModelRunnerOutput:
        if any(POISON in req.prompt_token_ids for req in so.requests):
            raise RuntimeError(FAULT_TEXT)
        return super().execute_model(so)


class BrokenWorker(Worker):
    """Every step that runs a request raises: a device that no longer works."""

    def execute_model(self, so: SchedulerOutput) -> ModelRunnerOutput:
        if so.requests:
            raise RuntimeError(FAULT_TEXT)
        return super().execute_model(so)


class NotAWorker:
    """Has the method but is no Worker: refused as a worker_cls."""

    def execute_model(self, so: SchedulerOutput) -> ModelRunnerOutput:
        return ModelRunnerOutput()
