-- The operation tree: modules and operations depth first, each with its place (path:line, which
-- <CR> jumps to) and, for each phase (forward, backward, and the update's where the iteration
-- has one), a bar against the iteration and a time; then `untracked`, the iteration's time no
-- operation took, so that the tree's rows add up to the iteration.
local format = require('skyline.format')
local layout = require('skyline.float.layout')
local project = require('skyline.project')

local M = {}

local MAX_DEPTH = 8
local MAX_TREE_ROWS = 200
-- The tree's columns: the operation's name and the place (path:line), between these widths,
-- then for each phase a bar and a time (TIME_WIDTH cells with the space before it).
local NAME_WIDTH = { min = 16, max = 40 }
local PLACE_WIDTH = { min = 14, max = 60 }
local TIME_WIDTH = 11
local MIN_TREE_BAR = 4 -- narrower, a bar says little: the tree shows its times alone
-- The last row: the iteration's time that no operation took, and what it is, in the place column.
local UNTRACKED = 'untracked'
local BETWEEN = 'between operations'
-- The tree's title, which on a GPU and on a busy CPU says what an operation's time is
-- (`attribution.device_time`).
local TITLE = 'Operations'
local DEVICE_TIME = {
  kernels = 'Operations (GPU kernel time)',
  spans = 'Operations (GPU stream spans)',
  thread_cpu = 'Operations (CPU time, CPU busy)',
}

---@class skyline.float.TreeRow
---@field node skyline.OperationNode
---@field depth integer
---@field place skyline.Frame?

---@class skyline.float.Phase
---@field field string the node's field: `forward_ms`, `backward_ms`, `step_ms`
---@field title string
---@field group string the bar's highlight group

-- The first frame of a node in a project file (not `<frozen …>` and the like).
---@param node skyline.OperationNode
---@return skyline.Frame?
local function place_of(node)
  for _, context in ipairs(node.contexts or {}) do
    if not context.path:match('^<') then
      return context
    end
  end
  return nil
end

-- The rows of the tree, depth first, at most MAX_TREE_ROWS of them.
---@param root skyline.OperationNode
---@return skyline.float.TreeRow[]
local function tree_rows(root)
  local rows = {}
  local function visit(node, depth)
    if #rows >= MAX_TREE_ROWS or depth > MAX_DEPTH then
      return
    end
    table.insert(rows, { node = node, depth = depth, place = place_of(node) })
    for _, child in ipairs(node.children or {}) do
      visit(child, depth + 1)
    end
  end
  visit(root, 0)
  return rows
end

-- The cells the name column needs for the rows, indented `step` cells a level.
local function names_need(rows, step)
  local need = NAME_WIDTH.min
  for _, row in ipairs(rows) do
    need = math.max(need, step * row.depth + vim.fn.strdisplaywidth(row.node.name) + 2)
  end
  return need
end

-- The widths of the name and place columns, and the indentation of a level: what the rows need,
-- within their bounds, the place giving way first (it is shortened in the middle) when the float
-- is narrower, then the indentation (one cell a level instead of two: a library's model nests six
-- levels deep, and at 80 columns its names were cut to `…`); but the place keeps `files` cells
-- (its file names and lines) where the names at their narrowest leave them. `numbers`: the cells
-- of the phases.
local function tree_columns(rows, width, numbers, files)
  local place = PLACE_WIDTH.min
  for _, row in ipairs(rows) do
    if row.place then
      place = math.max(place, vim.fn.strdisplaywidth(row.place.path .. ':' .. row.place.line) + 2)
    end
  end
  local two_a_level = names_need(rows, 2)
  local name = math.min(two_a_level, NAME_WIDTH.max)
  place = math.min(place, PLACE_WIDTH.max)
  local room = width - numbers
  local least = math.max(PLACE_WIDTH.min, math.min(files, room - NAME_WIDTH.min))
  place = math.max(least, math.min(place, room - name))
  local step = two_a_level > room - place and 1 or 2
  name = math.max(NAME_WIDTH.min, math.min(names_need(rows, step), NAME_WIDTH.max, room - place))
  return name, place, step
end

-- The tree's phases: forward and backward, and the update's (optimizer steps, clipping) where the
-- iteration has one, each a column of bars and times.
---@param root skyline.OperationNode
---@return skyline.float.Phase[]
local function tree_phases(root)
  local phases = {
    { field = 'forward_ms', title = 'forward', group = 'SkylineFloatForward' },
    { field = 'backward_ms', title = 'backward', group = 'SkylineFloatBackward' },
  }
  if (root.step_ms or 0) > 0 then
    table.insert(phases, { field = 'step_ms', title = 'step', group = 'SkylineFloatStep' })
  end
  return phases
end

-- The cells of a phase's bar: as long as the names at their narrowest and the places' file names
-- and lines leave room for; none (0) where that is under MIN_TREE_BAR cells (three phases at 80
-- columns: the times alone, and `entry_point.py:25` whole). Also the cells the places' file names
-- and lines take.
---@param rows skyline.float.TreeRow[]
---@return integer bar, integer files
local function bar_width(rows, width, phases)
  local files = PLACE_WIDTH.min
  for _, row in ipairs(rows) do
    if row.place then
      local file = vim.fs.basename(row.place.path) .. ':' .. row.place.line
      files = math.max(files, vim.fn.strdisplaywidth(file) + 2)
    end
  end
  local room = math.floor((width - NAME_WIDTH.min - files) / #phases) - TIME_WIDTH
  return room >= MIN_TREE_BAR and math.min(layout.BAR, room) or 0, files
end

---@class skyline.float.TreeColumns
---@field name integer the name column's cells
---@field place integer the place column's
---@field step integer the indentation of a level
---@field bar integer a phase's bar (0: none)
---@field phase integer a phase's cells, its bar and time
---@field total number the iteration's time, the bars' whole

-- The operations' time: the tree's phases, added up.
---@param root skyline.OperationNode
local function operations_ms(root)
  return (root.forward_ms or 0) + (root.backward_ms or 0) + (root.step_ms or 0)
end

-- The tree's columns for `width` cells, its bars against `iteration_ms`.
---@param rows skyline.float.TreeRow[]
---@param phases skyline.float.Phase[]
---@param root skyline.OperationNode
---@return skyline.float.TreeColumns
local function columns_for(rows, phases, root, width, iteration_ms)
  local total = math.max(operations_ms(root), iteration_ms)
  local bar, files = bar_width(rows, width, phases)
  local column = bar > 0 and bar + TIME_WIDTH or TIME_WIDTH - 1
  local name, place, step = tree_columns(rows, width, #phases * column, files)
  return { name = name, place = place, step = step, bar = bar, phase = column, total = math.max(total, 1e-9) }
end

-- A row's pieces: its name indented by its depth, its place, and each phase's bar and time (the
-- step's blank where the node has no part in the update, as most of the tree has none).
---@param row skyline.float.TreeRow
---@param columns skyline.float.TreeColumns
---@param phases skyline.float.Phase[]
---@return skyline.float.Piece[]
local function row_pieces(row, columns, phases)
  local node, place = row.node, row.place
  local where = place and layout.shorten_place(place.path, place.line, columns.place - 2) or ''
  local pieces = {
    { layout.cell(string.rep(' ', columns.step * row.depth) .. node.name, columns.name) },
    { layout.pad(where, columns.place), 'SkylineFloatMuted' },
  }
  local shown = (node.step_ms or 0) > 0 and #phases or 2
  for i = 1, shown do
    local ms = node[phases[i].field] or 0
    if columns.bar > 0 then
      table.insert(pieces, { format.bar(ms / columns.total, columns.bar) .. ' ', phases[i].group })
    end
    table.insert(pieces, { i < shown and layout.pad(format.ms(ms), TIME_WIDTH - 1) or format.ms(ms) })
  end
  return pieces
end

-- The untracked row, a part of the iteration beside its modules and operations: the time no
-- recorded operation took (Python between operations, an idle device), in the first phase's
-- column with a muted bar: it belongs to no phase.
---@param columns skyline.float.TreeColumns
---@return skyline.float.Piece[]
local function untracked_pieces(untracked_ms, columns)
  local pieces = {
    { layout.cell(string.rep(' ', columns.step) .. UNTRACKED, columns.name) },
    { layout.cell(BETWEEN, columns.place), 'SkylineFloatMuted' },
  }
  if columns.bar > 0 then
    table.insert(pieces, { format.bar(untracked_ms / columns.total, columns.bar) .. ' ', 'SkylineFloatMuted' })
  end
  table.insert(pieces, { format.ms(untracked_ms) })
  return pieces
end

---@param sheet skyline.float.Sheet
---@param context skyline.float.Context
function M.render(sheet, context)
  local root = context.document.operations
  if not root then
    return
  end
  local phases = tree_phases(root)
  local rows = tree_rows(root)
  local iteration_ms = context.document.iteration.run_time_ms or 0
  local columns = columns_for(rows, phases, root, context.width, iteration_ms)
  sheet:add({})
  local attribution = context.document.attribution or {}
  local header = layout.pad(DEVICE_TIME[attribution.device_time] or TITLE, columns.name + columns.place)
  for i, phase in ipairs(phases) do
    header = header .. (i < #phases and layout.pad(phase.title, columns.phase) or phase.title)
  end
  sheet:add({ { header, 'SkylineFloatHeader' } })
  for _, row in ipairs(rows) do
    local place = row.place
    sheet:add(row_pieces(row, columns, phases), place and {
      path = project.absolute(context.root, place.path),
      line = place.line,
    })
  end
  sheet:add(untracked_pieces(math.max(0, iteration_ms - operations_ms(root)), columns))
end

return M
