-- Memory: the peak against the device's capacity, the phase and line that reach it (and the other
-- tensors alive there), the allocator's reservation on CUDA, and the peak's parts (what is alive
-- there, adding up to it).
local constants = require('skyline.constants')
local format = require('skyline.format')
local layout = require('skyline.float.layout')

local M = {}

-- The other tensors alive at the memory peak (the document's `peak_memory_operation.other_tensors`)
-- worth naming, as the terminal report names them: those holding at least this share of the peak.

-- The phase that reached the peak, as the float names it: an iteration whose recording has no
-- backward work (inference, evaluation) has a forward pass, not a forward and backward one.
---@param document skyline.AnalysisDocument
local function phase_name(document, phase)
  local operations = document.operations
  if phase == constants.FORWARD_BACKWARD and not (operations and (operations.backward_ms or 0) > 0) then
    return constants.FORWARD_ONLY_LABEL
  end
  return constants.PEAK_PHASE_LABELS[phase]
end

--- `other tensors alive there from train.py:7: 15.6 MiB made in backward`; nil when none is notable.
---@param document skyline.AnalysisDocument
---@param at skyline.PeakMemoryOperation
---@return string?
local function other_tensors(document, at, width)
  local least = constants.NOTABLE_OTHER_TENSOR * document.iteration.peak_memory_bytes
  local kinds, places = {}, {} -- a line's tensors together, in the document's order (largest first)
  for _, tensor in ipairs(at.other_tensors or {}) do
    if tensor.bytes >= least then
      local place = layout.shorten_place(tensor.path, tensor.line, width - layout.LABEL)
      if not kinds[place] then
        kinds[place] = {}
        table.insert(places, place)
      end
      table.insert(
        kinds[place],
        format.bytes(tensor.bytes) .. ' ' .. (constants.TENSOR_KIND_LABELS[tensor.phase] or tensor.phase)
      )
    end
  end
  if #places == 0 then
    return nil
  end
  local named = vim.tbl_map(function(place)
    return 'from ' .. place .. ': ' .. table.concat(kinds[place], ', ')
  end, places)
  return 'other tensors alive there ' .. table.concat(named, '; ')
end

-- `Memory`, a bar of the peak against the capacity, the figures and the device (beneath them in
-- a narrow editor).
---@param sheet skyline.float.Sheet
---@param context skyline.float.Context
local function add_peak(sheet, context)
  local device = context.document.device
  local capacity = device.memory_capacity_bytes
  local peak = context.document.iteration.peak_memory_bytes
  local figures = string.format(' %s of %s', format.bytes(peak), format.bytes(capacity))
  local on = string.format('(%s, %s)', device.type, device.name)
  local one_line = layout.LABEL + 2 * layout.BAR + vim.fn.strdisplaywidth(figures .. ' ' .. on) <= context.width
  sheet:add({
    layout.label('Memory', 'SkylineFloatHeader'),
    { format.bar(peak / capacity, 2 * layout.BAR), 'SkylineFloatMemory' },
    { one_line and figures .. ' ' .. on or figures },
  })
  if not one_line then
    sheet:add_beneath(on)
  end
end

-- The phase that reaches the peak, the line and operation after which the recorded iteration's
-- memory peaked, and the other tensors alive there.
---@param sheet skyline.float.Sheet
---@param context skyline.float.Context
local function add_where(sheet, context)
  local document = context.document
  local phase = phase_name(document, document.iteration.peak_memory_phase)
  if not phase then
    return
  end
  local at = document.peak_memory_operation
  local where = ''
  if at and at.path then
    local place = layout.shorten_place(at.path, at.line, context.width - layout.LABEL) -- gives way in the middle
    where = string.format(', at %s (%s%s)', place, at.operation, at.phase == 'backward' and ', backward' or '')
  end
  sheet:add_beneath('peak reached in ' .. phase .. where, 'SkylineFloatMuted')
  local others = at and at.path and other_tensors(document, at, context.width)
  if others then
    sheet:add_beneath(others, 'SkylineFloatMuted')
  end
end

local function sum(list, field)
  local total = 0
  for _, item in ipairs(list or {}) do
    total = total + (item[field] or 0)
  end
  return total
end

-- The peak's parts: what is alive at the peak, adding up to it (`peak_memory_parts`); in a document
-- written before it, every weight, gradient, state and activation, and the rest.
---@param document skyline.AnalysisDocument
---@return table[] {label, bytes} each
local function parts_of(document)
  local at = document.peak_memory_parts
  if at then
    return {
      { 'weights', at.weights_bytes },
      { 'gradients', at.gradients_bytes },
      { 'optimizer', at.optimizer_state_bytes },
      { 'activations', at.activations_bytes },
      { 'other', at.other_bytes },
    }
  end
  return {
    { 'weights', sum(document.weights, 'size_bytes') },
    { 'gradients', sum(document.weights, 'grad_size_bytes') },
    { 'optimizer', sum(document.optimizer_state, 'size_bytes') },
    { 'activations', document.operations and document.operations.activation_bytes or 0 },
    { 'other', document.untracked and document.untracked.memory_bytes or 0 },
  }
end

-- The peak's parts, each a bar against the capacity.
---@param sheet skyline.float.Sheet
---@param document skyline.AnalysisDocument
local function add_parts(sheet, document)
  local capacity = document.device.memory_capacity_bytes
  for _, part in ipairs(parts_of(document)) do
    sheet:add({
      layout.label('  ' .. part[1], 'SkylineFloatMuted'),
      { format.bar(part[2] / capacity, 2 * layout.BAR), 'SkylineFloatMemory' },
      { ' ' .. format.bytes(part[2]) },
    })
  end
end

---@param sheet skyline.float.Sheet
---@param context skyline.float.Context
function M.render(sheet, context)
  local document = context.document
  add_peak(sheet, context)
  add_where(sheet, context)
  local reserved = document.iteration.peak_memory_reserved_bytes -- CUDA only: the peak plus the allocator's cache
  if type(reserved) == 'number' then
    sheet:add({ layout.label(''), { 'the allocator reserved ' .. format.bytes(reserved), 'SkylineFloatMuted' } })
  end
  add_parts(sheet, document)
  -- CUDA: the other memory holds cuBLAS's workspaces, which no tensor holds (absent from earlier documents).
  local workspaces = document.untracked and document.untracked.workspace_bytes
  if type(workspaces) == 'number' and workspaces > 0 then
    sheet:add({ layout.label(''), { format.bytes(workspaces) .. ' of it cuBLAS workspaces', 'SkylineFloatMuted' } })
  end
end

return M
