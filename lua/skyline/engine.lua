-- The glue to the remote plugin (rplugin/python3/skyline_rplugin): calls into it, and the one
-- entry point for everything it sends back, `on_message(event)`.
local config = require('skyline.config')
local state = require('skyline.state')
local util = require('skyline.util')

local M = {}

M.log_dir = util.log_dir

--- What the remote plugin starts (or connects to) for project `root`. A different spec makes
--- it replace the engine: one engine serves one project root.
function M.spec(root)
  local opts = config.get()
  local args = vim.deepcopy(opts.engine_args)
  if opts.device then
    vim.list_extend(args, { '--device', opts.device })
  end
  return {
    python = config.python(),
    project_root = root,
    engine_args = args,
    log_dir = M.log_dir(),
    remote = state.remote,
  }
end

local function first_line(text)
  return (tostring(text):gsub('^Vim[^:]*:', ''):match('[^\n]*'))
end

--- Whether the manifest defines the remote plugin's function `name`: it is a FuncUndefined
--- autocmd (starting the python3 host) until first called.
function M.registered(name)
  return vim.fn.exists('*' .. name) == 1 or vim.fn.exists('#FuncUndefined#' .. name) == 1
end

--- Calls the remote plugin's function `name`; false, after telling the user why, when the
--- remote plugin cannot be reached.
local function call(name, ...)
  if not M.registered(name) then
    util.error(
      'the remote plugin is not registered: run :UpdateRemotePlugins and restart Neovim'
        .. ' (see :checkhealth skyline)'
    )
    return false
  end
  local ok, err = pcall(vim.fn[name], ...)
  if not ok then
    util.error('the python3 host failed: ' .. first_line(err) .. ' (see :checkhealth skyline)')
  end
  return ok
end

function M.profile(spec, request)
  return call('SkylineRpcProfile', spec, request)
end

function M.cancel(generation)
  return call('SkylineRpcCancel', generation)
end

function M.connect(spec)
  return call('SkylineRpcConnect', spec)
end

-- What the remote plugin sends, by `event` (docs/protocol.md names most of them).
local function handlers()
  local profile = require('skyline.profile')
  return {
    connected = profile.on_connected,
    started = profile.on_started,
    progress = profile.on_progress,
    analysis = profile.on_analysis,
    analysis_error = profile.on_analysis_error,
    request_error = profile.on_request_error,
    engine_error = profile.on_engine_error,
    protocol_error = function(event)
      util.error('engine protocol error: ' .. tostring(event.message))
    end,
  }
end

--- Called by the remote plugin, on the main loop, for each event. A bug here must show as a
--- message, never as a traceback thrown back into the Python host.
function M.on_message(event)
  local handler = handlers()[event.event]
  if not handler then
    return
  end
  local ok, err = xpcall(handler, debug.traceback, event)
  if not ok then
    local log = vim.fs.joinpath(M.log_dir(), 'plugin.log')
    vim.fn.mkdir(M.log_dir(), 'p')
    vim.fn.writefile(vim.split(err, '\n'), log, 'a')
    util.error(string.format('internal error on `%s`: %s (details: %s)', event.event, first_line(err), log))
  end
end

return M
