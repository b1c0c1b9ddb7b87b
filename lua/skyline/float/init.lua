-- The breakdown float (:SkylineBreakdown): the sections below, top to bottom, laid out for the
-- editor's width (again on VimResized) in window.lua. Each section is a module of this folder
-- whose `render(sheet, context)` adds its lines to the sheet (layout.lua), or none: it reads the
-- context this module builds once per draw, never the editor's state. A new section is a module
-- and a name in SECTIONS.
local layout = require('skyline.float.layout')
local state = require('skyline.state')
local util = require('skyline.util')
local window = require('skyline.float.window')

local M = {}

local SECTIONS =
  { 'throughput', 'recommendation', 'compilation', 'memory', 'chart', 'distributed', 'operations', 'warnings' }

--- What a section reads: the document and the editor's state of it, as it is when the float is drawn.
---@class skyline.float.Context
---@field document skyline.AnalysisDocument the latest document of the current request
---@field width integer the most cells a line may take
---@field root string the project root (rows jump to absolute paths)
---@field measured skyline.Measurement the measurement at the document's batch size
---@field models skyline.Models? the models of the latest complete document that had them
---@field models_batch_size integer? that document's batch size: the recommendation's "yours"
---@field predictions skyline.Prediction[]? that document's predictions: the chart's rows
---@field batch_size integer? the batch size shown: the document's, or the one a key press set
---@field prediction skyline.Figures? the figures at `batch_size` (models.at)
---@field running boolean a profile is running: the figures at `batch_size` are being measured

---@return skyline.float.Context
local function context(width)
  return {
    document = state.document,
    width = width,
    root = state.request.root,
    measured = state.measured,
    models = state.models,
    models_batch_size = state.models_batch_size,
    predictions = state.predictions,
    batch_size = state.batch_size,
    prediction = state.prediction,
    running = state.running,
  }
end

--- The float's content for the current results, for a float at most `width` cells wide.
---@return skyline.float.Sheet
local function build(width)
  local sheet = layout.new(width)
  local shown = context(width)
  for _, name in ipairs(SECTIONS) do
    require('skyline.float.' .. name).render(sheet, shown)
  end
  return sheet
end

-- Public, as when the float was one file: the layout's wrap and shorten_place, the window's state.
M.wrap = layout.wrap
M.shorten_place = layout.shorten_place
M.is_open = window.is_open
M.close = window.close

--- Redraws an open float with the current results (a new document, a batch-size change).
function M.refresh()
  if not M.is_open() or not state.document then
    return
  end
  window.redraw(build(window.available_width()))
end

--- :SkylineBreakdown: open the float, or close it when it is open.
function M.toggle()
  if M.is_open() then
    M.close()
  elseif not (state.document and state.document.iteration) then
    util.error('no results yet: run :SkylineProfile first')
  else
    require('skyline.highlights').setup()
    local title = ' Skyline: ' .. vim.fs.basename(state.request.entry) .. ' '
    window.open(build(window.available_width()), title, M.refresh)
  end
end

return M
