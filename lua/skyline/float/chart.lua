-- Throughput and peak memory over the batch sizes of the analysis (a measured one showing its
-- measurement) and at the current one, each a bar against the largest; in a narrow editor the
-- bars give way.
local format = require('skyline.format')
local layout = require('skyline.float.layout')
local models = require('skyline.models')

local M = {}

---@class skyline.float.ChartRow
---@field batch_size integer
---@field samples_per_second number? nil where none can be shown
---@field peak_memory_bytes number
---@field fits boolean
---@field measured boolean?
---@field extrapolated boolean?
---@field largest boolean? the largest batch size predicted to fit
---@field recommended boolean? the document's recommended batch size

-- The rows of the chart: the document's predictions, a measured batch size showing its
-- measurement, one outside the trusted range marked as an extrapolation; the current batch size,
-- when the document has no row for it, predicted with the models' formula. Sorted by batch size.
---@param context skyline.float.Context
---@return skyline.float.ChartRow[]
local function chart_rows(context)
  local document = context.document
  local rows, current = {}, context.batch_size
  local has_current = false
  for _, p in ipairs(context.predictions or {}) do
    local shown = p.measured or p
    if p.batch_size == document.batch_size then
      shown = context.measured -- one figure per batch size: the latest measurement of it
    end
    table.insert(rows, {
      batch_size = p.batch_size,
      samples_per_second = layout.sane(shown.samples_per_second),
      peak_memory_bytes = shown.peak_memory_bytes,
      fits = shown ~= p or p.fits, -- a measured batch size ran: it fits
      measured = shown ~= p,
      extrapolated = p.extrapolated and shown == p,
      largest = p.batch_size == context.models.max_batch_size,
      recommended = p.batch_size == (context.models.recommendation or {}).batch_size,
    })
    has_current = has_current or p.batch_size == current
  end
  if current and not has_current then
    local row = current == document.batch_size and vim.tbl_extend('force', context.measured, { measured = true })
      or models.at(context.models, current)
    row.samples_per_second = layout.sane(row.samples_per_second)
    table.insert(rows, row)
  end
  table.sort(rows, function(a, b)
    return a.batch_size < b.batch_size
  end)
  return rows
end

-- What a chart row is, as the terminal report's table says it: measured, recommended, the largest
-- predicted to fit, an extrapolation.
---@param row skyline.float.ChartRow
local function notes(row)
  local said = {}
  if row.measured then
    table.insert(said, 'measured')
  end
  if row.recommended then
    table.insert(said, 'recommended')
  end
  if row.largest then
    table.insert(said, 'largest fit')
  end
  if row.extrapolated then
    table.insert(said, 'extrapolated')
  end
  return #said > 0 and '  ' .. table.concat(said, ', ') or ''
end

-- A row's pieces: the batch size (marked where it is the current one), its throughput and peak
-- memory, each a bar against the largest (`top`), and what it is.
---@param row skyline.float.ChartRow
---@param note string
---@param bar integer a bar's cells
---@param top {speed: number, memory: number}
---@return skyline.float.Piece[]
local function row_pieces(row, note, bar, top, is_current)
  local speed = row.samples_per_second
  local memory = ' ' .. format.bytes(row.peak_memory_bytes)
  local mark, number = layout.row_head(row.batch_size, is_current)
  return {
    mark,
    number,
    { speed and top.speed > 0 and format.bar(speed / top.speed, bar) or string.rep(' ', bar), 'SkylineFloatForward' },
    { ' ' .. layout.pad(format.integer(speed), 11) },
    { format.bar(top.memory > 0 and (row.peak_memory_bytes or 0) / top.memory or 0, bar), 'SkylineFloatMemory' },
    { (note ~= '' or row.fits == false) and layout.pad(memory, 12) or memory },
    { note, 'SkylineFloatMuted' },
    { row.fits == false and '  does not fit' or '', 'SkylineFloatWarn' },
  }
end

---@param sheet skyline.float.Sheet
---@param context skyline.float.Context
function M.render(sheet, context)
  if not context.models then
    return
  end
  local rows, top = chart_rows(context), { speed = 0, memory = 0 }
  for _, row in ipairs(rows) do
    top.speed = math.max(top.speed, row.samples_per_second or 0)
    top.memory = math.max(top.memory, row.peak_memory_bytes or 0)
  end
  local noted, longest = {}, 0
  for i, row in ipairs(rows) do
    noted[i] = notes(row)
    longest = math.max(longest, vim.fn.strdisplaywidth(noted[i] .. (row.fits == false and '  does not fit' or '')))
  end
  -- The columns: '▸ ', the batch size (10) and 2, a bar, the throughput (1 + 11), a bar, the memory (12).
  local bar = math.max(4, math.min(layout.BAR, math.floor((context.width - 38 - longest) / 2)))
  sheet:add({})
  local header = layout.pad('Batch size', 14) .. layout.pad('samples/s', bar + 12) .. 'peak memory'
  sheet:add({ { header, 'SkylineFloatHeader' } })
  for i, row in ipairs(rows) do
    sheet:add(row_pieces(row, noted[i], bar, top, row.batch_size == context.batch_size))
  end
end

return M
