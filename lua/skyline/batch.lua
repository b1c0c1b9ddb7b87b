-- Changing the batch size from the editor.
--
-- A key press (or :SkylineBatchSize) rewrites the integer literal of the `batch_size` default
-- in the entry point's buffer, and nothing else: one nvim_buf_set_text on the digits, so one
-- undo step. The throughput and memory at the new batch size are predicted at once from the
-- latest batch-size models (models.lua), and a debounced background re-profile measures them.
local config = require('skyline.config')
local format = require('skyline.format')
local models = require('skyline.models')
local project = require('skyline.project')
local state = require('skyline.state')
local util = require('skyline.util')

local M = {}

M.ns = vim.api.nvim_create_namespace('skyline.batch')

local MAX = 2147483647 -- the engine's largest batch size
-- How far below the `def skyline_input_provider(` line a multi-line signature may reach.
local SIGNATURE_LINES = 20

--- The batch_size default on one line of text: {col_start, col_end, value} (0-based byte
--- columns, end exclusive) when it is a plain integer literal; nil and the reason otherwise;
--- nil alone when the line has no `batch_size =` default.
local function literal_on(text)
  local _, name_end = text:find('%f[%w_]batch_size%f[^%w_]')
  if not name_end then
    return nil
  end
  local equals = text:match('^%s*:?[^=,()]*()=', name_end + 1) -- after an optional annotation
  if not equals then
    return nil
  end
  local start, digits, after = text:match('^%s*()(%d+)()', equals + 1)
  local rest = after and text:sub(after)
  if digits and (rest:match('^%s*[,)]') or rest:match('^%s*$') or rest:match('^%s*#')) then
    return { col_start = start - 1, col_end = after - 1, value = tonumber(digits) }
  end
  local expression = vim.trim(text:sub(equals + 1):match('^[^,)#]*'))
  return nil,
    string.format(
      'the batch_size default `%s` is not an integer literal; write a number to use the batch-size keys',
      expression
    )
end

-- Rows of the input provider's signature in `lines`, the hinted row first.
local function candidate_rows(lines, hint_row)
  local rows = {}
  if hint_row then
    table.insert(rows, hint_row)
  end
  for row, text in ipairs(lines) do
    if text:find('def%s+skyline_input_provider%s*%(') then
      for k = row, math.min(row + SIGNATURE_LINES, #lines) do
        table.insert(rows, k - 1)
        if lines[k]:find('%)%s*[-:]') then
          break
        end
      end
    end
  end
  return rows
end

-- The row of the engine's `batch_size_location`, mapped to where that line is now.
local function hinted_row(buf)
  local location = state.document and state.document.batch_size_location
  if location and state.request and project.buffer_path(buf) == state.request.entry then
    return require('skyline.profile').row_of(buf, location.line)
  end
  return nil
end

--- Finds the batch_size literal in the current text of `buf`: {row, col_start, col_end,
--- value}, or nil and why not.
function M.find_literal(buf)
  local lines = vim.api.nvim_buf_get_lines(buf, 0, -1, false)
  local reason
  for _, row in ipairs(candidate_rows(lines, hinted_row(buf))) do
    local text = lines[row + 1]
    if text then
      local literal, why = literal_on(text)
      if literal then
        literal.row = row
        return literal
      end
      reason = reason or why
    end
  end
  local location = state.document and state.document.batch_size_location
  return nil, reason or (location and location.reason) or 'no `batch_size=` default found in skyline_input_provider'
end

--- The batch size the buffer's literal says, or nil.
function M.literal_value(buf)
  local literal = M.find_literal(buf)
  return literal and literal.value
end

-- The entry point's buffer (loaded if needed) and its literal, or nil and a message.
local function target()
  if not state.models then
    if state.running then
      return nil, 'no results yet: the profile is still running; try again when it is done'
    elseif state.document then
      local why = table.concat(state.document.warnings or {}, ' ')
      return nil, 'the last profile has no batch-size models: ' .. why
    end
    return nil, 'no results yet: run :SkylineProfile first'
  end
  local entry = state.request.entry
  local buf = project.loaded_buffer(entry) or vim.fn.bufadd(entry)
  vim.fn.bufload(buf)
  if not vim.bo[buf].modifiable then
    return nil, 'the entry point buffer is not modifiable'
  end
  local literal, why = M.find_literal(buf)
  if not literal then
    return nil, why
  end
  literal.buf = buf
  return literal
end

--- The hint at the literal: the measured numbers, or the prediction after a change.
function M.show_hint()
  M.clear_hint()
  local document = state.document
  local buf = state.request and project.loaded_buffer(state.request.entry)
  local literal = buf and M.find_literal(buf)
  if not (document and literal and state.batch_size) then
    return
  end
  local shown, what = state.measured, 'measured'
  if state.batch_size ~= document.batch_size then
    shown, what = state.prediction, 'predicted'
  end
  if not shown then
    return
  end
  local text = string.format(
    '%s at %d: %s · %s%s',
    what,
    shown.batch_size,
    format.throughput(shown.samples_per_second),
    format.bytes(shown.peak_memory_bytes),
    shown.fits == false and ' · does not fit' or ''
  )
  local group = shown.fits == false and 'SkylineBatchWarn' or 'SkylineBatch'
  require('skyline.highlights').setup()
  vim.api.nvim_buf_set_extmark(buf, M.ns, literal.row, 0, {
    virt_text = { { text, group } },
    virt_text_pos = 'eol',
    hl_mode = 'combine',
    invalidate = true,
  })
end

function M.clear_hint()
  for _, buf in ipairs(vim.api.nvim_list_bufs()) do
    if vim.api.nvim_buf_is_loaded(buf) then
      vim.api.nvim_buf_clear_namespace(buf, M.ns, 0, -1)
    end
  end
end

local reprofile = util.debounce(function(entry)
  require('skyline.profile').start(entry, { quiet = true })
end)

local function warn_if_unreliable(prediction)
  if not prediction.fits then
    util.warn(
      string.format(
        'batch size %d is predicted to need %s, more than the %s usable on the device',
        prediction.batch_size,
        format.bytes(prediction.peak_memory_bytes),
        format.bytes(state.models.usable_memory_bytes)
      )
    )
  end
  local smallest = models.smallest_measured(state.models)
  if smallest and prediction.batch_size < smallest then
    util.warn(
      string.format(
        'batch size %d is below the smallest measured (%d): the prediction is a guess',
        prediction.batch_size,
        smallest
      )
    )
  end
end

-- The batch size is now `value`: predict, show, and schedule the re-profile that measures it.
local function changed_to(value)
  state.batch_size = value
  state.prediction = models.predict(state.models, value)
  warn_if_unreliable(state.prediction)
  M.show_hint()
  require('skyline.float').refresh()
  vim.cmd.redrawstatus({ bang = true })
  reprofile.call(config.get().reprofile_delay_ms, state.request.entry)
end

-- Writes `value` over the literal's digits, and nothing else: one undo step.
local function apply(literal, value)
  if value == literal.value then
    util.notify(string.format('the batch size is already %d', value))
    return
  end
  local row = literal.row
  vim.api.nvim_buf_set_text(literal.buf, row, literal.col_start, row, literal.col_end, { tostring(value) })
  changed_to(value)
end

local function stepped(value, direction, count)
  local step = config.get().batch_step
  if step == 'double' then
    return direction > 0 and value * 2 ^ count or math.floor(value / 2 ^ count)
  end
  return value + direction * step * count
end

--- The <Plug>(skyline-batch-inc/dec) maps: `count` steps up (direction 1) or down (-1).
function M.step(direction, count)
  local literal, why = target()
  if not literal then
    util.error(why)
    return
  end
  local value = math.floor(stepped(math.max(literal.value, 1), direction, count))
  apply(literal, math.max(1, math.min(MAX, value)))
end

--- :SkylineBatchSize {N|+N|-N|max}: the new value from `arg`, or nil and why not.
local function parse(arg, current)
  if arg == 'max' then
    local max = state.models.max_batch_size
    if max == nil then
      return nil, 'memory does not grow with the batch size, so no batch size is the largest that fits'
    elseif max == 0 then
      return nil, 'not even batch size 1 is predicted to fit in memory'
    end
    return math.min(max, MAX)
  end
  local sign, digits = arg:match('^([+-]?)(%d+)$')
  if not digits then
    return nil, string.format('expected N, +N, -N or max, not %q', arg)
  end
  local value = tonumber(digits)
  if sign == '+' then
    value = current + value
  elseif sign == '-' then
    value = current - value
  end
  if value < 1 or value > MAX then
    return nil, string.format('the batch size would be %d; it must be from 1 to %d', value, MAX)
  end
  return value
end

function M.set(arg)
  local literal, why = target()
  if not literal then
    util.error(why)
    return
  end
  local value, problem = parse(vim.trim(arg), literal.value)
  if not value then
    util.error(problem)
    return
  end
  apply(literal, value)
end

local KEYMAPS = {
  { 'batch_inc', '<Plug>(skyline-batch-inc)', 'skyline: larger batch size' },
  { 'batch_dec', '<Plug>(skyline-batch-dec)', 'skyline: smaller batch size' },
}

-- The default buffer-local maps, unless switched off or the user mapped the <Plug> already.
local function set_keymaps(buf)
  local keymaps = config.get().keymaps
  if keymaps == false then
    return
  end
  vim.api.nvim_buf_call(buf, function()
    for _, map in ipairs(KEYMAPS) do
      local lhs = keymaps[map[1]]
      if lhs ~= '' and vim.fn.hasmapto(map[2], 'n') == 0 then
        vim.keymap.set('n', lhs, map[2], { buffer = buf, remap = true, desc = map[3] })
      end
    end
  end)
end

-- A literal the user typed (or undid) counts like a key press: new prediction, re-profile.
local function follow_literal(buf)
  local value = state.models
    and state.request
    and project.buffer_path(buf) == state.request.entry
    and M.literal_value(buf)
  if value and value >= 1 and value ~= state.batch_size then
    changed_to(value)
  end
end

--- Makes `buf` the entry point's buffer: its default maps, and its literal followed.
function M.attach(buf)
  if vim.b[buf].skyline_attached then
    return
  end
  vim.b[buf].skyline_attached = true
  set_keymaps(buf)
  vim.api.nvim_buf_attach(buf, false, {
    on_lines = function()
      vim.schedule(function()
        if vim.api.nvim_buf_is_valid(buf) then
          follow_literal(buf)
        end
      end)
    end,
    on_detach = function()
      if vim.api.nvim_buf_is_valid(buf) then
        vim.b[buf].skyline_attached = nil
      end
    end,
  })
end

return M
