-- Options: one schema (name, default, validator, description) from which the defaults, the
-- validation (the 0.11 `vim.validate(name, value, validator, optional)` form, each error naming
-- the option by its dotted path) and the help's option list (checked by a test) all follow.
-- Works without setup(): `get()` falls back to the defaults.
local M = {}

-- A check vim.validate runs as a function, with what it expects for the message: vim.validate
-- writes `name: expected <expected>, got <value>`.
local function rule(fn, expected)
  return { fn = fn, expected = expected }
end

local function one_of(...)
  local names = { ... }
  return rule(function(v)
    return vim.tbl_contains(names, v)
  end, 'one of ' .. table.concat(names, ', '))
end

local positive_number = rule(function(v)
  return type(v) == 'number' and v > 0
end, 'a positive number')

local non_negative_integer = rule(function(v)
  return type(v) == 'number' and v >= 0 and v % 1 == 0
end, 'an integer >= 0')

local positive_integer = rule(function(v)
  return type(v) == 'number' and v >= 1 and v % 1 == 0
end, 'an integer >= 1')

local string_list = rule(function(v)
  return vim.islist(v) and vim.iter(v):all(function(s)
    return type(s) == 'string'
  end)
end, 'a list of strings')

local batch_step = rule(function(v)
  return v == 'double' or (type(v) == 'number' and v >= 1 and v % 1 == 0)
end, "'double' or an integer >= 1")

local share = rule(function(v)
  return type(v) == 'number' and v >= 0 and v <= 1
end, 'a number from 0 to 1')

local table_or_false = rule(function(v)
  return v == false or type(v) == 'table'
end, 'a table or false')

--- Every option, in the help's order: `validator` for vim.validate, a type name, a list of them
--- or a rule (with `optional`: nil is allowed); an option with `fields` is a table merged key by key over its default, each field
--- validated as `option.field`; any other option given replaces its default whole.
M.schema = {
  {
    name = 'python',
    default = nil,
    validator = 'string',
    optional = true,
    description = "The engine's interpreter (needs torch); nil: g:skyline_python, else the python3 host's own.",
  },
  {
    name = 'engine_args',
    default = {},
    validator = string_list,
    description = "Extra `skyline serve` arguments, e.g. { '--quick' } for shorter timings.",
  },
  {
    name = 'device',
    default = nil,
    validator = 'string',
    optional = true,
    description = "'auto', 'cpu', 'cuda' or 'cuda:N'; nil leaves the engine's default (auto).",
  },
  {
    name = 'project_root',
    default = nil,
    validator = 'string',
    optional = true,
    description = 'nil: the nearest folder above the entry point holding one of `root_markers`, else its folder.',
  },
  {
    name = 'root_markers',
    default = { '.git', 'pyproject.toml', 'setup.py', 'setup.cfg' },
    validator = string_list,
    description = 'Files or folders marking a project root.',
  },
  {
    name = 'entry_point',
    default = nil,
    validator = 'string',
    optional = true,
    description = 'Profiled when :SkylineProfile has no argument and the current buffer is not an entry point.',
  },
  {
    name = 'script_args',
    default = {},
    validator = string_list,
    description = "A training script's own arguments (its sys.argv[1:]) when :SkylineProfile gives none after `--`.",
  },
  {
    name = 'time_limit_s',
    default = nil,
    validator = positive_number,
    optional = true,
    description = "Seconds before an analysis is stopped; nil: the engine's limit.",
  },
  {
    name = 'memory_capacity',
    default = nil,
    validator = rule(function(v)
      return require('skyline.util').parse_size(v) ~= nil
    end, "bytes, or a size such as '24GiB' or '80GB'"),
    optional = true,
    description = 'Plan for a device with this much memory; nil: what the analysis device has available.',
  },
  {
    name = 'world_size',
    default = 1,
    validator = positive_integer,
    description = 'Data-parallel ranks to analyse (DistributedDataParallel above 1); a count before :SkylineProfile overrides it.',
  },
  {
    name = 'virt_text_pos',
    default = 'eol_right_align',
    validator = one_of('eol', 'eol_right_align', 'right_align'),
    description = "Where the per-line costs go: 'eol_right_align', 'eol' or 'right_align'.",
  },
  {
    name = 'costs',
    default = 'both',
    validator = one_of('both', 'self', 'inclusive'),
    description = "Per-line times: 'self' (the line's own operations), 'inclusive' (with everything it calls), 'both'.",
  },
  {
    name = 'priorities',
    default = { virt_text = 4096, signs = 10 },
    validator = 'table',
    fields = { virt_text = non_negative_integer, signs = non_negative_integer },
    description = 'Extmark priority of the per-line costs, and sign priority of the error diagnostics.',
  },
  {
    name = 'cost_thresholds',
    default = { mid = 0.05, high = 0.20 },
    validator = 'table',
    fields = { mid = share, high = share },
    description = 'Shares of the iteration from which a line counts as mid or high cost.',
  },
  {
    name = 'float_border',
    default = nil,
    validator = { 'string', 'table' },
    optional = true,
    description = "Border of the breakdown float; nil: 'winborder' when set, else 'rounded'.",
  },
  {
    name = 'batch_step',
    default = 'double',
    validator = batch_step,
    description = "'double' (×2 / ÷2 per press) or a positive integer added or subtracted per press.",
  },
  {
    name = 'reprofile_delay_ms',
    default = 800,
    validator = non_negative_integer,
    description = 'Quiet time after the last batch-size change before the background re-profile.',
  },
  {
    name = 'keymaps',
    default = { batch_inc = '<localleader>+', batch_dec = '<localleader>-' },
    validator = table_or_false,
    fields = { batch_inc = 'string', batch_dec = 'string' },
    description = "Buffer-local maps in the entry point's buffer; false: none; '' disables one.",
  },
  {
    name = 'profile_on_save',
    default = true,
    validator = 'boolean',
    description = 'Re-profile when a Python file of the profiled project is written.',
  },
  {
    name = 'save_debounce_ms',
    default = 300,
    validator = non_negative_integer,
    description = 'Quiet time after a write before that re-profile.',
  },
}

local by_name = {}
M.defaults = {}
for _, option in ipairs(M.schema) do
  by_name[option.name] = option
  M.defaults[option.name] = vim.deepcopy(option.default)
end

local current = vim.deepcopy(M.defaults)

local function validate(path, value, validator, optional)
  if type(validator) == 'table' and validator.fn then
    vim.validate(path, value, validator.fn, optional, validator.expected)
  else
    vim.validate(path, value, validator, optional)
  end
end

--- Raises `path: expected …, got …` for the first invalid option; unknown names are collected.
local function check(opts, unknown)
  for name, value in pairs(opts) do
    local option = by_name[name]
    if option == nil then
      table.insert(unknown, name)
    else
      validate(name, value, option.validator, option.optional)
      if option.fields and type(value) == 'table' then
        for field, field_value in pairs(value) do
          local validator = option.fields[field]
          if validator == nil then
            table.insert(unknown, name .. '.' .. field)
          else
            validate(name .. '.' .. field, field_value, validator)
          end
        end
      end
    end
  end
end

--- Validates `opts`, merges them over the defaults and makes them current.
--- Returns (true, unknown option names) or (false, message); never raises.
function M.apply(opts)
  local unknown = {}
  local ok, err = pcall(function()
    vim.validate('opts', opts, 'table', true)
    check(opts or {}, unknown)
  end)
  if not ok then
    return false, (tostring(err):gsub('^.-:%d+: ', '')) -- without the position of vim.validate
  end
  local merged = vim.deepcopy(M.defaults)
  for name, value in pairs(opts or {}) do
    local option = by_name[name]
    if option and option.fields and type(value) == 'table' then
      for field in pairs(option.fields) do
        if value[field] ~= nil then
          merged[name][field] = vim.deepcopy(value[field])
        end
      end
    elseif option then
      merged[name] = vim.deepcopy(value)
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
