-- skyline.literal: Python's integer literals, and the batch_size default the keys edit.
local units = require('lua_units')
local eq = units.eq
local literal = require('skyline.literal')

local cases = {}

--- literal.find's two results, the literal and the reason there is none, as a list.
local function find(lines, near)
  local found, why = literal.find(lines, near)
  return { found, why }
end

function cases.python_integer_literals()
  local expected = {
    { '128', 128 },
    { '0', 0 },
    { '00', 0 },
    { '1_024', 1024 },
    { '0x80', 128 },
    { '0X_80', 128 },
    { '0o200', 128 },
    { '0b10000000', 128 },
    { '0128', nil }, -- a syntax error in Python 3
    { '1__0', nil },
    { '1_', nil },
    { '_1', nil },
    { '0x', nil },
    { '0b2', nil },
    { '1.5', nil },
    { '1e3', nil },
    { '128j', nil },
    { '', nil },
    { 'abc', nil },
  }
  for _, case in ipairs(expected) do
    eq(case[2], (literal.integer(case[1])), case[1])
  end
end

function cases.the_literal_on_one_line()
  -- text, the literal found {col_start, col_end, value} or nil, a fragment of the reason or nil
  local expected = {
    { 'def skyline_input_provider(batch_size=128):', { col_start = 38, col_end = 41, value = 128 } },
    { '    batch_size: int = 64,  # the default', { col_start = 22, col_end = 24, value = 64 } },
    { 'def skyline_input_provider(*, batch_size = 0x20):', { col_start = 43, col_end = 47, value = 32 } },
    { '    batch_size=8', { col_start = 15, col_end = 16, value = 8 } },
    { 'def f(model_batch_size=4):', nil }, -- another name: no default of batch_size
    { 'def f(batch_size):', nil },
    { 'def skyline_input_provider(batch_size=2 ** 7):', nil, '`2 ** 7` is not an integer literal' },
    { 'def skyline_input_provider(batch_size=-4):', nil, '`-4` is not an integer literal' },
    { 'def skyline_input_provider(batch_size=0):', nil, '`0` must be greater than 0' },
    { 'def skyline_input_provider(batch_size=1.5):', nil, '`1.5` is not an integer literal' },
    { 'def skyline_input_provider(batch_size=(128)):', nil, 'is not an integer literal' },
  }
  for _, case in ipairs(expected) do
    local text, literal_found, reason = case[1], case[2], case[3]
    local found, why = literal.on_line(text)
    eq(literal_found, found, text)
    if reason == nil then
      eq(nil, why, text)
    else
      units.holds(why, reason, text)
    end
  end
end

function cases.the_literal_in_a_file()
  local multi_line = {
    'import torch',
    '',
    'def skyline_input_provider(',
    '    seed: int = 0,',
    '    batch_size: int = 256,  # per step',
    ') -> tuple:',
    '    return (torch.randn(batch_size, 4),)',
  }
  -- Non-ASCII before the literal: columns count bytes (é is two), as nvim_buf_set_text does.
  local non_ascii = { 'def skyline_input_provider(légende="é", batch_size=32):' }
  local later_wins = {
    'def skyline_input_provider(batch_size=16):',
    '    pass',
    'def skyline_input_provider(batch_size=48):',
  }
  local no_provider = { 'def other(batch_size=16):', '    pass' }
  local outside_signature = { 'def skyline_input_provider(n=1):', '    batch_size = 12' }
  eq({ { row = 4, col_start = 22, col_end = 25, value = 256 } }, find(multi_line), 'multi_line')
  eq({ { row = 0, col_start = 53, col_end = 55, value = 32 } }, find(non_ascii), 'non_ascii')
  eq({ { row = 2, col_start = 38, col_end = 40, value = 48 } }, find(later_wins), 'later_wins')
  eq({}, find(no_provider), 'no_provider')
  eq({}, find(outside_signature), 'outside_signature')
end

function cases.the_constant_the_default_names()
  -- As the engine finds them (tests/test_batch_size_location.py): a constant at the top of the
  -- file that only the default reads is the literal; anything else keeps the keys off.
  local provider = 'def skyline_input_provider(batch_size=BATCH):'
  local commented = { 'BATCH_SIZE = 64  # per device', '', 'def skyline_input_provider(batch_size=BATCH_SIZE):' }
  local annotated = { 'BATCH: int = 0x20', 'def skyline_input_provider(*, batch_size=BATCH):' }
  local longer_name_first = { 'BATCH_SIZE = 8', 'BATCH = 32', provider }
  local used = { 'BATCH = 32', 'LR = 0.1 * BATCH', provider }
  local twice = { 'BATCH = 32', 'BATCH = 64', provider }
  local imported = { 'from config import BATCH', provider }
  local keyword = { 'def skyline_input_provider(batch_size=None):' }
  eq({ { row = 0, col_start = 13, col_end = 15, value = 64 } }, find(commented), 'commented')
  eq({ { row = 0, col_start = 13, col_end = 17, value = 32 } }, find(annotated), 'annotated')
  eq({ { row = 1, col_start = 8, col_end = 10, value = 32 } }, find(longer_name_first), 'longer_name_first')
  local also = 'the batch_size default `BATCH` is also on line %d: write a number, or a constant only the default uses'
  for _, case in ipairs({ { used, 2, 'used' }, { twice, 2, 'twice' }, { imported, 1, 'imported' } }) do
    local found, why = literal.find(case[1])
    eq(nil, found, case[3])
    units.starts(why, also:format(case[2]), case[3])
  end
  eq({
    nil,
    'the batch_size default `None` is not an integer literal; write a number to use the batch-size keys',
  }, find(keyword), 'keyword')
end

function cases.the_literal_of_the_definition_that_ran()
  -- `if`/`else`: the engine found the first definition to have run (its location's row, 2,
  -- where the buffer holds it now); the text alone would say the last one.
  local branches = {
    'import os',
    "if os.name == 'posix':",
    '    def skyline_input_provider(batch_size=64):',
    '        pass',
    'else:',
    '    def skyline_input_provider(batch_size=8):',
    '        pass',
  }
  eq({ { row = 2, col_start = 42, col_end = 44, value = 64 } }, find(branches, 2), 'row 2')
  eq({ { row = 5, col_start = 42, col_end = 43, value = 8 } }, find(branches, 5), 'row 5')
  -- where the analysis located it is unknown: the last one
  eq(find(branches, 5), find(branches), 'no row')
end

return cases
