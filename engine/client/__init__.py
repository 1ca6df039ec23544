"""Clients that connect the frontend to an EngineCore (in-process or behind the ring)."""

from engine.client.core_client import AsyncEngineCoreClient, EngineCoreClient, InprocClient
from engine.client.factory import make_client

__all__ = ["AsyncEngineCoreClient", "EngineCoreClient", "InprocClient", "make_client"]
