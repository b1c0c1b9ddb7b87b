"""Skyline's remote plugin: a thin relay between the Lua UI (`lua/skyline/`) and the engine.

Lua calls the functions below (all asynchronous: Neovim never waits for them); they hand the
work to an `EngineHub`, whose threads talk to `skyline serve`. Everything the engine says comes
back to Lua as one event per message, through `nvim.async_call` (the only safe way from a
thread) and `require('skyline.engine').on_message(event)`.

Imports stay light (stdlib, pynvim, msgpack): the python3 host imports every remote plugin
before it answers Neovim, so a heavy import here would freeze the editor at start, and a missing
one would silently drop the plugin from the manifest. torch lives in the engine's process only.
"""

from __future__ import annotations

import logging
from typing import Any

import pynvim

from .hub import EngineHub
from .wire import Event, without_nones

log = logging.getLogger(__name__)

ON_MESSAGE = "return require('skyline.engine').on_message(...)"


@pynvim.plugin
class SkylinePlugin:
    def __init__(self, nvim: pynvim.Nvim) -> None:
        self.nvim = nvim
        self.hub = EngineHub(self._emit)

    @pynvim.function("SkylineRpcProfile", sync=False)
    def profile(self, args: list[Any]) -> None:
        """args: [engine spec, request {request, entry_point, batch_size?, time_limit_s?, script_args?, …}]."""
        spec, request = args
        self.hub.analyze(spec, request)

    @pynvim.function("SkylineRpcCancel", sync=False)
    def cancel(self, args: list[Any]) -> None:
        """args: [request generation]: stop the analysis started for it, now or when it starts."""
        self.hub.cancel(args[0])

    @pynvim.function("SkylineRpcConnect", sync=False)
    def connect(self, args: list[Any]) -> None:
        """args: [engine spec]: (re)connect now, so a wrong address or token shows at once."""
        self.hub.connect(args[0])

    def _emit(self, event: Event) -> None:
        """Called from any thread: deliver `event` to Lua on Neovim's main loop."""
        self.nvim.async_call(self._deliver, without_nones(event))

    def _deliver(self, event: Event) -> None:
        try:
            self.nvim.exec_lua(ON_MESSAGE, event)
        except Exception:  # a UI error must not surface as a Python traceback
            log.exception("skyline: delivering %s to Lua failed", event.get("event"))
