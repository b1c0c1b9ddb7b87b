-- skyline.anchors: lines of the file the engine analysed, and where they are in the buffer now.
local eq = require('lua_units').eq
local anchors = require('skyline.anchors')

local cases = {}

local FILE = {
  'import torch',
  '',
  'def f(x):',
  '    return x',
  '',
  'def skyline_input_provider(batch_size=128):',
  '    pass',
}

--- The lists given, one after the other.
local function joined(...)
  local out = {}
  for _, list in ipairs({ ... }) do
    vim.list_extend(out, list)
  end
  return out
end

--- {[file line] = buffer line} for the file's seven lines, each moved by `by`.
local function moved(by)
  local map = {}
  for line = 1, #FILE do
    map[line] = line + by
  end
  return map
end

function cases.file_lines_map_to_buffer_lines()
  local expected = {
    { 'the same text', FILE, moved(0), false },
    {
      -- Only the batch_size literal differs: the same text, for what the request sends.
      'another batch size',
      joined(vim.list_slice(FILE, 1, 5), { 'def skyline_input_provider(batch_size=4096):', '    pass' }),
      moved(0),
      false,
    },
    -- Two lines added at the top: every line moves down by two.
    { 'two lines added', joined({ '# a', '# b' }, FILE), moved(2), true },
    -- Line 2 deleted: lines below move up; the deleted one has no row.
    {
      'line 2 deleted',
      joined({ FILE[1] }, vim.list_slice(FILE, 3)),
      { [1] = 1, [3] = 2, [4] = 3, [5] = 4, [6] = 5, [7] = 6 },
      true,
    },
    -- Line 4 changed in place: it is still that line.
    {
      'line 4 changed',
      joined(vim.list_slice(FILE, 1, 3), { '    return x * 2' }, vim.list_slice(FILE, 5)),
      moved(0),
      true,
    },
    -- Line 4 replaced by two lines: neither is it; the lines below move down by one.
    {
      'line 4 replaced by two',
      joined(vim.list_slice(FILE, 1, 3), { '    y = x', '    return y' }, vim.list_slice(FILE, 5)),
      { [1] = 1, [2] = 2, [3] = 3, [5] = 6, [6] = 7, [7] = 8 },
      true,
    },
  }
  for _, case in ipairs(expected) do
    local what, buffer, map, differs = case[1], case[2], case[3], case[4]
    local found, changed = anchors.file_to_buffer(vim.deepcopy(FILE), buffer)
    eq(map, found, what)
    eq(differs, changed, what .. ': whether the buffer differs')
  end
end

return cases
