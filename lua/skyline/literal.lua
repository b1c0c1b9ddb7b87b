-- The batch_size default of an entry point's input provider, found in text: the editor's half of
-- skyline_engine/entry/batch_size.py (find_batch_size_location), for a buffer edited since the
-- analysis located it. Pure: lines in, 0-based byte columns out (end exclusive), as the engine
-- and nvim_buf_set_text count them. Text is scanned, not parsed: it covers a default written on
-- the line of its parameter, in the signature of the `def skyline_input_provider(` the analysis
-- found to have run (when its row is known), else of the last one.
local constants = require('skyline.constants')

local M = {}

-- How far below the `def skyline_input_provider(` line a multi-line signature may reach.
local SIGNATURE_LINES = 20

local BASES = {
  ['0x'] = { 16, '^%x+$' },
  ['0o'] = { 8, '^[0-7]+$' },
  ['0b'] = { 2, '^[01]+$' },
}

--- The value of `text` when it is exactly one Python integer literal (`128`, `1_024`, `0x80`,
--- `0o200`, `0b1`), else nil.
function M.integer(text)
  local base, pattern, digits = 10, '^%d+$', text
  local prefixed = BASES[text:sub(1, 2):lower()]
  if prefixed then
    base, pattern, digits = prefixed[1], prefixed[2], text:sub(3)
  end
  -- Underscores only between digits, as Python allows them (after a base prefix too).
  if digits:find('__') or digits:find('_$') or (base == 10 and digits:find('^_')) then
    return nil
  end
  local plain = digits:gsub('^_', ''):gsub('_', '')
  if not plain:find(pattern) then
    return nil
  end
  if base == 10 and plain:find('^0') and plain:find('[1-9]') then
    return nil -- `0128` is a syntax error in Python 3
  end
  return tonumber(plain, base)
end

--- The batch_size default on one line: {col_start, col_end, value} when it is a positive integer
--- literal; nil and why not when it is something else (and the name, when it is a bare name: a
--- constant `M.find` may resolve); nil alone when the line has no `batch_size=` default.
function M.on_line(text)
  local _, name_end = text:find('%f[%w_]' .. constants.BATCH_SIZE_PARAMETER .. '%f[^%w_]')
  if not name_end then
    return nil
  end
  local equals = text:match('^%s*:?[^=,()]*()=', name_end + 1) -- after an optional annotation
  if not equals then
    return nil
  end
  local start, token, after = text:match('^%s*()([%w_]+)()', equals + 1)
  local value = token and M.integer(token)
  local rest = after and text:sub(after) or ''
  local ends = rest:match('^%s*[,)]') or rest:match('^%s*$') or rest:match('^%s*#')
  if value and ends and value > 0 then
    return { col_start = start - 1, col_end = after - 1, value = value }
  end
  local expression = vim.trim(text:sub(equals + 1):match('^[^,)#]*'))
  if value and ends then
    return nil, string.format('the batch_size default `%s` must be greater than 0', expression)
  end
  -- A bare name may be a constant (`M.constant`); Python's own constants are not.
  local keyword = token == 'True' or token == 'False' or token == 'None'
  local name = ends and not keyword and token and token:match('^[%a_][%w_]*$')
  return nil,
    string.format(
      'the batch_size default `%s` is not an integer literal; write a number to use the batch-size keys',
      expression
    ),
    name
end

-- Whether `text` holds `name` as a word.
local function mentions(text, name)
  return text:find('%f[%w_]' .. name .. '%f[^%w_]') ~= nil
end

--- The module-level constant `name` the default names (`BATCH_SIZE = 64` at the top, then
--- `batch_size=BATCH_SIZE`): {row (0-based), col_start, col_end, value} of its literal, when it is
--- assigned once, at column 0, to a positive integer literal, and no other line but the default's
--- (`default_row`, 1-based) mentions it; else nil and why. The engine's `_locate_constant`, read
--- from text: a mention in a comment or a string counts too.
function M.constant(lines, name, default_row)
  local found, why
  for row, text in ipairs(lines) do
    -- `NAME = 64` or `NAME: int = 64`, at column 0, a comment after it at most.
    local rest = text:match('^' .. name .. '%s*=(.*)$') or text:match('^' .. name .. '%s*:[^=]*=(.*)$')
    local offset = rest and #text - #rest or 0
    local start, token, after = (rest or ''):match('^%s*()([%w_]+)()%s*$')
    if not start then
      start, token, after = (rest or ''):match('^%s*()([%w_]+)()%s*#')
    end
    local value = token and M.integer(token)
    if value and value > 0 and not found then
      start, after = start + offset, after + offset
      found = { row = row - 1, col_start = start - 1, col_end = after - 1, value = value }
    elseif row ~= default_row and mentions(text, name) then
      why = why
        or string.format(
          'the batch_size default `%s` is also on line %d: write a number, or a constant only the default uses, to use the batch-size keys',
          name,
          row
        )
    end
  end
  if why or not found then
    return nil,
      why or string.format(
        'the batch_size default `%s` is not one positive integer literal assigned at the top of the file; write a number to use the batch-size keys',
        name
      )
  end
  return found
end

-- Rows (1-based) of the signature of a `def skyline_input_provider(` in `lines`: the last one at or
-- above row `near` (1-based) when given (the definition the analysis found to have run, where its
-- line is now: with definitions in `if`/`else`, the last in the text may not be it), else the last
-- one, as in Python, where it replaces the earlier ones.
local function signature(lines, near)
  local def = '^%s*def%s+' .. constants.INPUT_PROVIDER .. '%s*%('
  local first
  for row, text in ipairs(lines) do
    if text:find(def) and (near == nil or row <= near or first == nil) then
      first = row
    end
  end
  local rows = {}
  for row = first or 1, first and math.min(first + SIGNATURE_LINES, #lines) or 0 do
    table.insert(rows, row)
    if lines[row]:find('%)%s*[-:]') then
      break
    end
  end
  return rows
end

--- The batch_size literal in `lines` (a file's or buffer's text): {row (0-based), col_start,
--- col_end, value}; else nil and why not (nil alone when there is no default at all). `near`: the
--- 0-based row where the analysis located the default (nil: unknown).
function M.find(lines, near)
  for _, row in ipairs(signature(lines, near and near + 1)) do
    local found, why, name = M.on_line(lines[row])
    if found then
      found.row = row - 1
      return found
    elseif name then
      return M.constant(lines, name, row)
    elseif why then
      return nil, why
    end
  end
  return nil
end

return M
