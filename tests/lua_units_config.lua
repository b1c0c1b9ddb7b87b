-- skyline.config: the options' schema, their defaults, and setup()'s checks.
local units = require('lua_units')
local eq = units.eq
local config = require('skyline.config')

local cases = {}

function cases.the_defaults_come_from_the_schema()
  eq({
    engine_args = {},
    root_markers = { '.git', 'pyproject.toml', 'setup.py', 'setup.cfg' },
    script_args = {},
    world_size = 1,
    virt_text_pos = 'eol_right_align',
    costs = 'both',
    priorities = { virt_text = 4096, signs = 10 },
    cost_thresholds = { mid = 0.05, high = 0.20 },
    batch_step = 'double',
    reprofile_delay_ms = 800,
    keymaps = { batch_inc = '<localleader>+', batch_dec = '<localleader>-' },
    profile_on_save = true,
    save_debounce_ms = 300,
  }, config.defaults, 'defaults')
  local names = vim.tbl_map(function(option)
    return option.name
  end, config.schema)
  eq({
    'python',
    'engine_args',
    'device',
    'project_root',
    'root_markers',
    'entry_point',
    'script_args',
    'time_limit_s',
    'memory_capacity',
    'world_size',
    'virt_text_pos',
    'costs',
    'priorities',
    'cost_thresholds',
    'float_border',
    'batch_step',
    'reprofile_delay_ms',
    'keymaps',
    'profile_on_save',
    'save_debounce_ms',
  }, names, 'the options, in order')
  for _, option in ipairs(config.schema) do
    local description = option.description
    assert(
      type(description) == 'string' and description ~= '' and not description:find('\n'),
      option.name .. ': its description is no one-line text'
    )
  end
end

function cases.a_bad_option_is_named_and_changes_nothing()
  local expected = {
    { { python = 3 }, 'python: expected string, got number' },
    { { engine_args = '--quick' }, 'engine_args: expected a list of strings, got --quick' },
    { { root_markers = { '.git', 1 } }, 'root_markers: expected a list of strings' },
    { { script_args = '--epochs 1' }, 'script_args: expected a list of strings, got --epochs 1' },
    { { time_limit_s = 0 }, 'time_limit_s: expected a positive number' },
    { { virt_text_pos = 'inline' }, 'virt_text_pos: expected one of eol, eol_right_align, right_align' },
    { { cost_thresholds = 0.5 }, 'cost_thresholds: expected table, got number' },
    { { cost_thresholds = { high = 2 } }, 'cost_thresholds.high: expected a number from 0 to 1' },
    { { cost_thresholds = { mid = 0.5, high = 0.4 } }, 'cost_thresholds: expected mid <= high' },
    { { float_border = 1 }, 'float_border: expected string|table, got number' },
    { { batch_step = 0 }, "batch_step: expected 'double' or an integer >= 1" },
    { { batch_step = 1.5 }, "batch_step: expected 'double' or an integer >= 1" },
    { { reprofile_delay_ms = -1 }, 'reprofile_delay_ms: expected an integer >= 0' },
    { { keymaps = true }, 'keymaps: expected a table or false' },
    { { keymaps = { batch_inc = 3 } }, 'keymaps.batch_inc: expected string, got number' },
    { { profile_on_save = 'yes' }, 'profile_on_save: expected boolean, got string' },
    { { save_debounce_ms = 0.5 }, 'save_debounce_ms: expected an integer >= 0' },
  }
  for _, case in ipairs(expected) do
    local options, message = case[1], case[2]
    local what = vim.inspect(options, { newline = ' ', indent = '' })
    local before = vim.deepcopy(config.get())
    local ok, result = config.apply(options)
    eq(false, ok, what)
    units.starts(result, message, what)
    units.holds(result, message, what)
    eq(before, config.get(), what .. ' changed the options')
  end
end

function cases.good_options_merge_over_the_defaults()
  local ok, unknown = config.apply({
    device = 'cpu',
    root_markers = { 'setup.py' }, -- a list replaces the default whole
    cost_thresholds = { high = 0.5 }, -- a table is merged key by key
    keymaps = { batch_dec = '' },
    batch_step = 4,
    float_border = { '+', '-', '+', '|', '+', '-', '+', '|' },
    colour = 1,
    keymaps_extra = true,
  })
  eq(true, ok)
  table.sort(unknown)
  eq({ 'colour', 'keymaps_extra' }, unknown)
  local current = config.get()
  eq('cpu', current.device)
  eq({ 'setup.py' }, current.root_markers)
  eq({ mid = 0.05, high = 0.5 }, current.cost_thresholds)
  eq({ batch_inc = '<localleader>+', batch_dec = '' }, current.keymaps)
  eq(4, current.batch_step)
  eq(nil, current.colour)
  ok, unknown = config.apply({ keymaps = false, cost_thresholds = { low = 0.1 } })
  eq(true, ok)
  eq({ 'cost_thresholds.low' }, unknown)
  eq(false, config.get().keymaps)
  -- Each apply starts from the defaults: options of an earlier setup() do not linger.
  eq(nil, config.get().device)
  eq({ true, {} }, { config.apply() })
end

function cases.profile_arguments_split_at_the_first_double_dash()
  local split = require('skyline.commands').split_profile_args
  eq({ nil, nil }, { split({}) }, 'nothing: this buffer, the last arguments')
  eq({ 'train.py', nil }, { split({ 'train.py' }) }, 'a file')
  eq({ nil, { '--epochs', '1' } }, { split({ '--', '--epochs', '1' }) }, 'arguments for this buffer')
  eq({ 'train.py', { '--x', '--', 'y' } }, { split({ 'train.py', '--', '--x', '--', 'y' }) }, 'the first -- splits')
  eq({ nil, {} }, { split({ '--' }) }, 'an empty list: no arguments, not the last ones')
  local entry, why = split({ 'train.py', '--epochs', '1' })
  eq(false, entry, 'two files, or arguments without --')
  units.holds(why, 'its own arguments go after `--`')
end

return cases
