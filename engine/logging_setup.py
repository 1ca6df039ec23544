"""ringllm's log handler, installed by the entry points rather than by ``import engine``.

One handler for the ``engine`` and ``shm_transport`` loggers (as vLLM gives its own), unless
the application already configured them. Done on first use of an entry point (``LLM``,
``AsyncLLM``, ``LLMEngine``, the ``ringllm`` command, the EngineCore process) so that importing
the package changes nothing in the importing program.
"""

from __future__ import annotations

import logging

_FORMAT = "%(levelname)s %(asctime)s [%(filename)s:%(lineno)d] %(message)s"
_LOGGERS = ("engine", "shm_transport")


def configure_logging() -> None:
    """Idempotent: a logger that has a handler (ours or the application's) is left alone."""
    from engine import envs

    handler = None
    for name in _LOGGERS:
        logger = logging.getLogger(name)
        if logger.handlers:
            continue
        if handler is None:
            handler = logging.StreamHandler()
            handler.setFormatter(logging.Formatter(_FORMAT, "%m-%d %H:%M:%S"))
        logger.addHandler(handler)
        logger.setLevel(envs.RINGLLM_LOGGING_LEVEL)
