-- Files and buffers of the profiled project: which file is the entry point, where the project
-- root is, and how the document's root-relative paths map to buffers.
local config = require('skyline.config')
local constants = require('skyline.constants')

local M = {}

function M.normalize(path)
  return vim.fs.normalize(vim.fn.fnamemodify(vim.fn.expand(path), ':p'))
end

--- The file a buffer shows, or nil for scratch, help, terminal and unnamed buffers.
function M.buffer_path(buf)
  if not vim.api.nvim_buf_is_valid(buf) or vim.bo[buf].buftype ~= '' then
    return nil
  end
  local name = vim.api.nvim_buf_get_name(buf)
  return name ~= '' and vim.fs.normalize(name) or nil
end

function M.is_python(buf)
  local path = M.buffer_path(buf)
  return vim.bo[buf].filetype == 'python' or (path ~= nil and path:match('%.py$') ~= nil)
end

--- Whether the buffer defines any of the three providers (a `def` at any indentation): it is an
--- entry point, and one that misses a provider (or misspells it) is told so by the engine.
function M.defines_providers(buf)
  local text = '\n' .. table.concat(vim.api.nvim_buf_get_lines(buf, 0, -1, false), '\n')
  for _, name in ipairs(constants.PROVIDERS) do
    if text:find('\n%s*def%s+' .. name .. '%s*%(') then
      return true
    end
  end
  return false
end

--- Whether the buffer is a training script: it defines none of the providers (the engine's rule,
--- skyline_engine/entry/script.py) and steps an optimizer (`.step(`), which a helper module such as
--- model.py does not: there, :SkylineProfile keeps profiling the configured or last target.
function M.is_training_script(buf)
  local text = '\n' .. table.concat(vim.api.nvim_buf_get_lines(buf, 0, -1, false), '\n')
  for _, name in ipairs(constants.PROVIDERS) do
    if text:find(name, 1, true) then
      return false
    end
  end
  return text:find('%.step%s*%(') ~= nil
end

local function readable(path)
  return vim.fn.filereadable(path) == 1
end

--- The entry point for :SkylineProfile [arg]: the argument; else the current buffer when it
--- defines a provider or is a training script; else the configured entry point; else the last
--- one profiled.
--- Returns the absolute path (and, for the configured or last one, why not the current buffer's),
--- or nil and a message.
function M.resolve_entry(arg, last)
  if arg and arg ~= '' then
    local path = M.normalize(arg)
    if not readable(path) then
      return nil, string.format('entry point not found: %s', arg)
    end
    return path
  end
  local buf = vim.api.nvim_get_current_buf()
  local current = M.buffer_path(buf)
  if current and M.is_python(buf) and (M.defines_providers(buf) or M.is_training_script(buf)) then
    return current
  end
  local configured = config.get().entry_point
  if configured then
    local path, why = M.resolve_entry(configured)
    if not path then
      return nil, why
    end
    return path, nil, 'the configured one: this buffer is no entry point'
  end
  if last then
    return last, nil, 'the last one: this buffer is no entry point'
  end
  if current == nil or not M.is_python(buf) then
    return nil, 'not a Python buffer: :SkylineProfile path/to/train.py'
  end
  return nil,
    string.format(
      'this buffer neither trains (no optimizer step) nor defines %s; name the script or entry point: :SkylineProfile path/to/train.py',
      table.concat(constants.PROVIDERS, ', ')
    )
end

--- The project root of an entry point: the option, else the nearest folder with a root marker,
--- else the entry point's folder. The engine reports every path relative to it.
function M.root(entry)
  local configured = config.get().project_root
  if configured then
    return M.normalize(configured)
  end
  return vim.fs.root(entry, config.get().root_markers) or vim.fs.dirname(entry)
end

--- `path` relative to `root`, or nil when it lies outside.
function M.relative(root, path)
  local prefix = root:gsub('/$', '') .. '/'
  if path:sub(1, #prefix) == prefix then
    return path:sub(#prefix + 1)
  end
  return nil
end

function M.absolute(root, relative)
  return vim.fs.normalize(vim.fs.joinpath(root, relative))
end

--- Loaded buffers of Python files under `root`.
function M.buffers(root)
  local found = {}
  for _, buf in ipairs(vim.api.nvim_list_bufs()) do
    local path = M.buffer_path(buf)
    if vim.api.nvim_buf_is_loaded(buf) and path and M.relative(root, path) and M.is_python(buf) then
      table.insert(found, buf)
    end
  end
  return found
end

--- The loaded buffer showing `path`, or nil.
function M.loaded_buffer(path)
  for _, buf in ipairs(vim.api.nvim_list_bufs()) do
    if vim.api.nvim_buf_is_loaded(buf) and M.buffer_path(buf) == path then
      return buf
    end
  end
  return nil
end

return M
