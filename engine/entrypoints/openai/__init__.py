"""The OpenAI-compatible HTTP server (aiohttp): ``build_app`` in server.py is its one factory."""
