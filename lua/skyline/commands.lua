-- The user commands (defined in plugin/skyline.lua) and their completion.
local batch = require('skyline.batch')
local constants = require('skyline.constants')
local engine = require('skyline.engine')
local float = require('skyline.float')
local profile = require('skyline.profile')
local project = require('skyline.project')
local state = require('skyline.state')
local util = require('skyline.util')

local M = {}

--- The world size a :SkylineProfile asks for: its count (`:2SkylineProfile`), else the option.
function M.world_size(count)
  if count and count > 0 then
    return count
  end
  return require('skyline.config').get().world_size
end

--- The entry (or nil) and the script arguments (nil without `--`) of `:SkylineProfile [entry] [-- args]`,
--- or nil and why not.
---@param fargs string[]
---@return string|false|nil entry, string[]|string|nil script_args
function M.split_profile_args(fargs)
  local dashes = nil
  for i, arg in ipairs(fargs) do
    if arg == '--' then
      dashes = i
      break
    end
  end
  local before = dashes and vim.list_slice(fargs, 1, dashes - 1) or fargs
  if #before > 1 then
    return false,
      'name one entry point or script; its own arguments go after `--`: :SkylineProfile train.py -- --epochs 1'
  end
  return before[1], dashes and vim.list_slice(fargs, dashes + 1) or nil
end

--- :[N]SkylineProfile [entry] [-- args]: N data-parallel ranks (default: the `world_size` option);
--- a training script's own arguments after `--` (default: the last profile's of that script, else
--- the `script_args` option).
function M.profile(args)
  local arg, script_args = M.split_profile_args(args.fargs)
  if arg == false then
    util.error(script_args)
    return
  end
  local entry, why, instead = project.resolve_entry(arg, state.request and state.request.entry)
  if not entry then
    util.error(why)
    return
  end
  profile.start(entry, { world_size = M.world_size(args.count), instead = instead, script_args = script_args })
end

function M.stop()
  profile.stop()
end

function M.breakdown()
  float.toggle()
end

--- :SkylineBatchSize {N|+N|-N|max}
function M.batch_size(args)
  batch.set(args.args, args.bang)
end

function M.clear()
  profile.clear()
end

--- :SkylineToggle: hides the current buffer's costs, or shows them again.
function M.toggle()
  profile.toggle_buffer(vim.api.nvim_get_current_buf())
end

local function read_token(path)
  local ok, lines = pcall(vim.fn.readfile, path, '', 1)
  local token = ok and lines[1] and vim.trim(lines[1]) or ''
  if token == '' then
    return nil
  end
  return token
end

--- :SkylineConnect {host:port|local} [token-file]
function M.connect(args)
  local address, token_file = args.fargs[1], args.fargs[2]
  if address == 'local' then
    state.remote = nil
    util.notify('the next profile uses the local engine')
    return
  end
  local host, port = util.parse_address(address or '')
  if not host then
    util.error(string.format('expected HOST:PORT (e.g. 127.0.0.1:7070) or local, not %q', address or ''))
    return
  end
  token_file = project.normalize(token_file or constants.default_token_path())
  local token = read_token(token_file)
  if not token then
    util.error('cannot read a token from ' .. token_file .. ' (skyline serve --listen prints where it wrote it)')
    return
  end
  state.remote = { host = host, port = port, token = token }
  local here = project.buffer_path(vim.api.nvim_get_current_buf()) or vim.fn.getcwd()
  local root = state.request and state.request.root or project.root(here)
  engine.connect(engine.spec(root))
end

local function matching(candidates, arglead)
  return vim.tbl_filter(function(candidate)
    return vim.startswith(candidate, arglead)
  end, candidates)
end

--- Python files and folders.
function M.complete_entry(arglead)
  return vim.tbl_filter(function(path)
    return path:match('/$') or path:match('%.py$')
  end, vim.fn.getcompletion(arglead, 'file'))
end

function M.complete_batch_size(arglead)
  local candidates = { 'max' }
  local b = state.batch_size
  if b then
    vim.list_extend(candidates, { tostring(b * 2), tostring(math.max(1, math.floor(b / 2))) })
  end
  return matching(candidates, arglead)
end

function M.complete_connect(arglead, cmdline)
  local previous = vim.split(vim.trim(cmdline), '%s+')
  local typing_second = #previous > 2 or (#previous == 2 and cmdline:match('%s$'))
  if typing_second then
    return vim.fn.getcompletion(arglead, 'file')
  end
  return matching({ 'local', '127.0.0.1:7070', 'localhost:7070' }, arglead)
end

return M
