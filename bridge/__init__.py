"""oam-bridge: NPC brains for any game engine, over line-delimited JSON-RPC on stdio."""

__version__ = "0.1.0"

from bridge.core._messages import Limits  # noqa: E402
from bridge.jsonrpc._server import Server  # noqa: E402
from bridge.core._service import Service  # noqa: E402
from bridge.engines import EngineRegistry  # noqa: E402
from bridge.engines.scripted import ScriptedEngine  # noqa: E402
from bridge.errors import ERROR_CODES, BridgeError  # noqa: E402

__all__ = ["ERROR_CODES", "BridgeError", "EngineRegistry", "Limits", "ScriptedEngine", "Server", "Service", "__version__"]
