-- Options: defaults, validation (the 0.11 `vim.validate(name, value, validator, optional)` form,
-- each error naming the option), and the current values. Works without setup(): `get()` falls
-- back to the defaults.
local M = {}

M.defaults = {
  -- The engine's interpreter (needs torch); nil: g:skyline_python, else the python3 host's own.
  python = nil,
  -- Extra `skyline serve` arguments, e.g. { '--quick' } for shorter timings.
  engine_args = {},
  -- 'auto', 'cpu', 'cuda' or 'cuda:N'; nil leaves the engine's default (auto).
  device = nil,
  -- nil: the nearest folder above the entry point holding one of `root_markers`, else its folder.
  project_root = nil,
  root_markers = { '.git', 'pyproject.toml', 'setup.py', 'setup.cfg' },
  -- Profiled when :SkylineProfile has no argument and the current buffer is not an entry point.
  entry_point = nil,
  -- Seconds before an analysis is stopped; nil: the engine's limit.
  time_limit_s = nil,
  -- Where the per-line costs go: 'eol_right_align', 'eol' or 'right_align'.
  virt_text_pos = 'eol_right_align',
  -- Shares of the iteration from which a line counts as mid or high cost.
  cost_thresholds = { mid = 0.05, high = 0.20 },
  -- Border of the breakdown float; nil: 'winborder' when set, else 'rounded'.
  float_border = nil,
  -- 'double' (×2 / ÷2 per press) or a positive integer added or subtracted per press.
  batch_step = 'double',
  -- Quiet time after the last batch-size change before the background re-profile.
  reprofile_delay_ms = 800,
  -- Buffer-local maps in the entry point's buffer; false: none; '' disables one.
  keymaps = { batch_inc = '<localleader>+', batch_dec = '<localleader>-' },
  -- Re-profile when a file of the profiled project is written (after this quiet time).
  profile_on_save = true,
  save_debounce_ms = 300,
}

local current = vim.deepcopy(M.defaults)

local POSITIONS = { eol = true, eol_right_align = true, right_align = true }

local function one_of(set)
  local names = vim.tbl_keys(set)
  table.sort(names)
  return function(v)
    return set[v] == true, 'one of ' .. table.concat(names, ', ')
  end
end

local function positive_number(v)
  return type(v) == 'number' and v > 0, 'a positive number'
end

local function non_negative_integer(v)
  return type(v) == 'number' and v >= 0 and v % 1 == 0, 'an integer >= 0'
end

local function string_list(v)
  return vim.islist(v) and vim.iter(v):all(function(s)
    return type(s) == 'string'
  end), 'a list of strings'
end

local function batch_step(v)
  return v == 'double' or (type(v) == 'number' and v >= 1 and v % 1 == 0), "'double' or an integer >= 1"
end

local function share(v)
  return type(v) == 'number' and v >= 0 and v <= 1, 'a number from 0 to 1'
end

-- Every option: its validator and whether nil is allowed. Nested tables list their own leaves.
local SCHEMA = {
  python = { 'string', true },
  engine_args = { string_list },
  device = { 'string', true },
  project_root = { 'string', true },
  root_markers = { string_list },
  entry_point = { 'string', true },
  time_limit_s = { positive_number, true },
  virt_text_pos = { one_of(POSITIONS) },
  cost_thresholds = { mid = { share }, high = { share } },
  float_border = { { 'string', 'table' }, true },
  batch_step = { batch_step },
  reprofile_delay_ms = { non_negative_integer },
  keymaps = { batch_inc = { 'string' }, batch_dec = { 'string' } },
  profile_on_save = { 'boolean' },
  save_debounce_ms = { non_negative_integer },
}

local function is_leaf(spec)
  return spec[1] ~= nil
end

--- Raises `path: expected …, got …` for the first invalid option; unknown ones are collected.
local function check(opts, schema, prefix, unknown)
  for key, value in pairs(opts) do
    local path = prefix .. key
    local spec = schema[key]
    if spec == nil then
      table.insert(unknown, path)
    elseif is_leaf(spec) then
      vim.validate(path, value, spec[1], spec[2])
    elseif not (path == 'keymaps' and value == false) then
      vim.validate(path, value, 'table')
      check(value, spec, path .. '.', unknown)
    end
  end
end

--- Validates `opts`, merges them over the defaults and makes them current.
--- Returns (true, unknown option names) or (false, message); never raises.
function M.apply(opts)
  local unknown = {}
  local ok, err = pcall(function()
    vim.validate('opts', opts, 'table', true)
    check(opts or {}, SCHEMA, '', unknown)
  end)
  if not ok then
    return false, (tostring(err):gsub('^.-:%d+: ', '')) -- without the position of vim.validate
  end
  opts = opts or {}
  local merged = vim.tbl_deep_extend('force', vim.deepcopy(M.defaults), opts)
  for _, list in ipairs({ 'engine_args', 'root_markers' }) do
    if opts[list] then
      merged[list] = vim.deepcopy(opts[list]) -- replaced as a whole, never merged by index
    end
  end
  local thresholds = merged.cost_thresholds
  if thresholds.mid > thresholds.high then
    return false, 'cost_thresholds: expected mid <= high'
  end
  current = merged
  return true, unknown
end

function M.get()
  return current
end

--- The engine's interpreter: the option, then g:skyline_python; nil lets the host use its own.
function M.python()
  return current.python or vim.g.skyline_python
end

return M
