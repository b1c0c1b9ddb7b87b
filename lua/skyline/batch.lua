-- Changing the batch size from the editor.
--
-- A key press (or :SkylineBatchSize) rewrites the integer literal of the `batch_size` default
-- in the entry point's buffer, and nothing else: one nvim_buf_set_text on the digits, so one
-- undo step. The literal is where the document's `batch_size_location` says while the buffer is
-- unchanged since the request that produced the document (or since this module's own last
-- write); only after other edits is it located again in the text (literal.lua). The throughput
-- and memory at the new batch size are predicted at once from the latest batch-size models
-- (models.lua), and a debounced background re-profile measures them.
local anchors = require('skyline.anchors')
local config = require('skyline.config')
local constants = require('skyline.constants')
local format = require('skyline.format')
local literal = require('skyline.literal')
local models = require('skyline.models')
local project = require('skyline.project')
local recommendation = require('skyline.recommendation')
local state = require('skyline.state')
local util = require('skyline.util')

local M = {}

M.ns = vim.api.nvim_create_namespace('skyline.batch')

-- The literal as this module last wrote it: {buf, tick, row, col_start, col_end, value}; where it
-- is for as long as the buffer's changedtick is still `tick`.
local written = nil

-- Where the document's `batch_size_location` (the definition that ran) is in `buf` now, through
-- the request's anchors, whatever was edited since; nil when unknown.
local function located_row(buf)
  local document, request = state.document, state.request
  local location = document and document.batch_size_location
  local seen = request and request.buffers[buf]
  if not (location and seen) or project.buffer_path(buf) ~= project.absolute(request.root, location.path) then
    return nil
  end
  return anchors.row(buf, seen.anchor, location.line)
end

-- The literal at the document's `batch_size_location`, when `buf` is the entry point's buffer
-- and holds the text the engine analysed: saved when the request that produced the document
-- was made, and unchanged (changedtick) since. The location's line is mapped through that
-- request's anchors; its byte columns are used as they are.
local function from_document(buf, tick)
  local location = state.document and state.document.batch_size_location
  local seen = state.request and state.request.buffers[buf]
  if not (location and location.editable and seen and not seen.modified and seen.tick == tick) then
    return nil
  end
  local row = located_row(buf)
  if not row then
    return nil
  end
  -- A last check that these bytes are the literal: the file may have changed on disk meanwhile.
  local text = vim.api.nvim_buf_get_lines(buf, row, row + 1, false)[1] or ''
  if literal.integer(text:sub(location.col_start + 1, location.col_end)) ~= location.value then
    return nil
  end
  return { row = row, col_start = location.col_start, col_end = location.col_end, value = location.value }
end

--- Finds the batch_size literal of `buf`: {row, col_start, col_end, value} (0-based row, byte
--- columns), or nil and why not.
function M.find_literal(buf)
  local tick = vim.api.nvim_buf_get_changedtick(buf)
  if written and written.buf == buf and written.tick == tick then
    return vim.deepcopy(written)
  end
  local known = from_document(buf, tick)
  if known then
    return known
  end
  local found, why = literal.find(vim.api.nvim_buf_get_lines(buf, 0, -1, false), located_row(buf))
  if found then
    return found
  end
  local location = state.document and state.document.batch_size_location
  return nil,
    why or (location and location.reason) or string.format(
      'no `%s=` default found in %s',
      constants.BATCH_SIZE_PARAMETER,
      constants.INPUT_PROVIDER
    )
end

--- The batch size the buffer's literal says, or nil.
function M.literal_value(buf)
  local found = M.find_literal(buf)
  return found and found.value
end

-- The entry point's buffer (loaded if needed) and its literal, or nil and a message. A training
-- script's literal is set even where its profile has no models (its batch size could not be
-- changed in memory, say): nothing is predicted then, the re-profile measures it.
local function target()
  if not state.models then
    if state.running then
      return nil, 'no results yet: the profile is still running; try again when it is done'
    elseif not state.document then
      return nil, 'no results yet: run :SkylineProfile first'
    end
  end
  local entry = state.request.entry
  local buf = project.loaded_buffer(entry) or vim.fn.bufadd(entry)
  vim.fn.bufload(buf)
  if not state.models and not project.is_training_script(buf) then
    local why = state.document.models_withheld or table.concat(state.document.warnings or {}, ' ')
    return nil, 'the last profile has no batch-size models: ' .. why
  end
  if not vim.bo[buf].modifiable then
    return nil, 'the entry point buffer is not modifiable'
  end
  local found, why = M.find_literal(buf)
  if not found then
    return nil, why
  end
  found.buf = buf
  return found
end

-- What the hint says of the document's recommendation (models.recommendation) at `batch_size`:
-- that it is the recommended one; where a key press took it from the analysed batch size, whether
-- towards or away from it; at the analysed one, what to use instead. '' without one.
local function beside_recommendation(batch_size)
  local advice = recommendation.of(state.models)
  if not (advice and advice.batch_size) then
    return ''
  end
  local from = state.models_batch_size or (state.document and state.document.batch_size) or batch_size
  local direction = recommendation.direction(advice, from, batch_size)
  local recommended = format.integer(advice.batch_size)
  if direction == 'at' or batch_size == advice.batch_size then
    return ' · recommended'
  elseif direction == 'towards' then
    return string.format(' · towards %s, the recommended', recommended)
  elseif direction == 'away' then
    return string.format(' · away from %s, the recommended', recommended)
  end
  return ' · ' .. recommendation.short(advice, batch_size)
end

--- The hint at the literal: the measured numbers, or the prediction after a change, and where
--- the batch size stands to the recommended one.
function M.show_hint()
  M.clear_hint()
  local document = state.document
  local buf = state.request and project.loaded_buffer(state.request.entry)
  local found = buf and M.find_literal(buf)
  if not (document and found and state.batch_size) then
    return
  end
  local shown, what = state.measured, 'measured'
  if state.batch_size ~= document.batch_size then
    shown = state.prediction
    what = shown and shown.measured and 'measured' or 'predicted'
  end
  if not shown then
    if not state.models and state.batch_size ~= document.batch_size then
      -- A training script without models: nothing predicted, the re-profile measures the new batch size.
      require('skyline.highlights').setup()
      vim.api.nvim_buf_set_extmark(buf, M.ns, found.row, 0, {
        virt_text = { { string.format('measuring %d…', state.batch_size), 'SkylineBatch' } },
        virt_text_pos = 'eol',
        hl_mode = 'combine',
        invalidate = true,
      })
    end
    return
  end
  local text = string.format(
    '%s at %d: %s · %s%s%s',
    what,
    shown.batch_size,
    format.throughput(shown.samples_per_second),
    format.bytes(shown.peak_memory_bytes),
    shown.fits == false and ' · does not fit' or '',
    beside_recommendation(shown.batch_size)
  )
  local group = shown.fits == false and 'SkylineBatchWarn' or 'SkylineBatch'
  require('skyline.highlights').setup()
  vim.api.nvim_buf_set_extmark(buf, M.ns, found.row, 0, {
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
  -- Accumulation to a fixed number of samples a step (`256 // batch_size` micro-batches): whole
  -- micro-batches take them all only at a batch size that divides them (at 100, 200 a step).
  local per_step = state.models.samples_per_step ~= vim.NIL and state.models.samples_per_step or nil
  if per_step and prediction.batch_size <= per_step and per_step % prediction.batch_size ~= 0 then
    util.warn(
      string.format(
        'batch size %s does not divide your %s samples per optimizer step: whole micro-batches of it cannot make '
          .. 'them up (the time predicted counts %.2f of them)',
        format.integer(prediction.batch_size),
        format.integer(per_step),
        per_step / prediction.batch_size
      )
    )
  end
  local low, high = unpack(state.models.trusted_range)
  if prediction.extrapolated then
    util.warn(
      string.format(
        'batch size %s is outside the trusted range (%s-%s: up to %s): %s',
        format.integer(prediction.batch_size),
        format.integer(low),
        format.integer(high),
        models.trusted_range_end(state.models),
        prediction.samples_per_second and 'the prediction is an extrapolation' or 'no time is predicted there'
      )
    )
  end
end

-- The batch size is now `value`: predict, show, and schedule the re-profile that measures it.
local function changed_to(value)
  state.batch_size = value
  state.prediction = models.at(state.models, value)
  if state.prediction then -- none for a training script without models: measured, not predicted
    warn_if_unreliable(state.prediction)
  end
  M.show_hint()
  require('skyline.float').refresh()
  vim.cmd.redrawstatus({ bang = true })
  reprofile.call(config.get().reprofile_delay_ms, state.request.entry)
end

-- On a CPU, a batch size predicted to take more than this share of the memory the analysis saw
-- available is profiled only once the user says so: it could fill the machine's memory.
local CONFIRM_MEMORY_SHARE = 0.5

-- Whether profiling batch size `value` is fine, and whether the user was asked: asks when it is
-- predicted to take much of a CPU machine's memory (`force`, :SkylineBatchSize!, skips the
-- question). Nothing is said after a question: a message then would pile onto the prompt's lines
-- into a hit-enter prompt.
local function confirmed(value, force, note)
  local document = state.document
  local device = document and document.device
  local prediction = models.predict(state.models, value)
  if force or not (device and device.type == 'cpu' and prediction) then
    return true, false
  end
  local available = device.memory_capacity_bytes
  if prediction.peak_memory_bytes <= CONFIRM_MEMORY_SHARE * available then
    return true, false
  end
  local question = string.format(
    'Batch size %s is predicted to need %s, more than half of the %s this machine had available. Set it and profile it?',
    format.integer(value),
    format.bytes(prediction.peak_memory_bytes),
    format.bytes(available)
  )
  return vim.fn.confirm((note and (note .. '.\n') or '') .. question, '&Yes\n&No', 2) == 1, true
end

-- Writes `value` over the literal's digits, and nothing else: one undo step. `note`: what the
-- user should know about the value, said once (in the question, when there is one).
local function apply(found, value, force, note)
  if value == found.value then
    util.notify(string.format('the batch size is already %d', value))
    return
  end
  local yes, asked = confirmed(value, force, note)
  if not yes then
    return -- the answer was no: nothing changes, nothing more to say
  end
  if note and not asked then
    util.notify(note)
  end
  local digits = tostring(value)
  -- A new undo step, also when the press comes from another buffer (Neovim closes undo steps of
  -- the current buffer only): setting 'undolevels' ends the one before.
  vim.api.nvim_buf_call(found.buf, function()
    vim.cmd('let &l:undolevels = &l:undolevels')
  end)
  vim.api.nvim_buf_set_text(found.buf, found.row, found.col_start, found.row, found.col_end, { digits })
  written = {
    buf = found.buf,
    tick = vim.api.nvim_buf_get_changedtick(found.buf),
    row = found.row,
    col_start = found.col_start,
    col_end = found.col_start + #digits,
    value = value,
  }
  changed_to(value)
end

local function stepped(value, direction, count)
  local step = config.get().batch_step
  if step == 'double' then
    return direction > 0 and value * 2 ^ count or math.floor(value / 2 ^ count)
  end
  return value + direction * step * count
end

-- The direction of the last key press, for the operator that dot-repeats it.
local repeated_direction = 1

--- The <Plug>(skyline-batch-inc/dec) maps (expression maps): the key press becomes an operator
--- (`g@l`), so that `.` repeats it, with its count or a new one.
function M.repeatable(direction)
  repeated_direction = direction
  vim.go.operatorfunc = "v:lua.require'skyline.batch'.operator"
  return 'g@l'
end

--- The operator of the batch-size keys: v:count is the press's (or the repeat's) count.
function M.operator()
  M.step(repeated_direction, vim.v.count1)
end

--- `count` steps up (direction 1) or down (-1).
function M.step(direction, count)
  local found, why = target()
  if not found then
    util.error(why)
    return
  end
  local value = math.floor(stepped(math.max(found.value, 1), direction, count))
  apply(found, math.max(1, math.min(constants.MAX_BATCH_SIZE, value)))
end

--- :SkylineBatchSize {N|+N|-N|max}: the new value from `arg` (and a note on it), or nil and why not.
local function parse(arg, current)
  if arg == 'max' then
    if not state.models then
      local why = state.document and state.document.models_withheld or 'the last profile has none'
      return nil, 'max is what the batch-size models predict to fit, and there are none: ' .. why
    end
    local max = state.models.max_batch_size
    if max == nil then
      return nil, 'memory does not grow with the batch size, so no batch size is the largest that fits'
    elseif max == 0 then
      return nil, 'not even batch size 1 is predicted to fit in memory'
    end
    local high = state.models.trusted_range[2]
    if max > high then
      local note = string.format(
        'the largest batch size predicted to fit is %s, beyond the trusted range (up to %s: %s): using %s',
        format.integer(max),
        format.integer(high),
        models.trusted_range_end(state.models),
        format.integer(high)
      )
      return high, nil, note
    end
    return math.min(max, constants.MAX_BATCH_SIZE)
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
  if value < 1 or value > constants.MAX_BATCH_SIZE then
    return nil, string.format('the batch size would be %d; it must be from 1 to %d', value, constants.MAX_BATCH_SIZE)
  end
  return value
end

--- :SkylineBatchSize[!] {N|+N|-N|max}; `force` (the !) profiles without asking.
function M.set(arg, force)
  local found, why = target()
  if not found then
    util.error(why)
    return
  end
  local value, problem, note = parse(vim.trim(arg), found.value)
  if not value then
    util.error(problem)
    return
  end
  apply(found, value, force, note)
end

local KEYMAPS = {
  { 'batch_inc', '<Plug>(skyline-batch-inc)', 'skyline: larger batch size' },
  { 'batch_dec', '<Plug>(skyline-batch-dec)', 'skyline: smaller batch size' },
}

--- The default buffer-local maps in `buf` (any buffer of the profiled project: they edit the
--- entry point's literal), unless switched off or the user mapped the <Plug> already.
function M.set_keymaps(buf)
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

--- The default maps in `buf` before any profile, where it can be profiled: it defines the
--- providers, or is a training script (a helper module gets them once its project is profiled).
function M.map_if_profilable(buf)
  if project.defines_providers(buf) or project.is_training_script(buf) then
    M.set_keymaps(buf)
  end
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
