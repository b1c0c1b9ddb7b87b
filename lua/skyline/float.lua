-- The breakdown float: throughput (measured, the knee), memory against the device's capacity
-- (its parts, and the phase that sets the peak), throughput and memory at the batch sizes of the
-- analysis (measured ones showing the measurement) and at the current one, data parallel (the
-- ranks, communication and throughput over world sizes), the operation tree with forward,
-- backward and (where the iteration updates parameters) step times and bars, and the warnings.
-- Laid out for the editor's width, again on VimResized. <CR> on a row that names a line jumps
-- there; q and <Esc> close.
local constants = require('skyline.constants')
local config = require('skyline.config')
local format = require('skyline.format')
local models = require('skyline.models')
local project = require('skyline.project')
local state = require('skyline.state')
local util = require('skyline.util')

local M = {}

local ns = vim.api.nvim_create_namespace('skyline.float')
local BAR = 12
local MAX_DEPTH = 8
local MAX_TREE_ROWS = 200
-- The tree's columns: the operation's name and the place (path:line), between these widths,
-- then for each phase a bar and a time (TIME_WIDTH cells with the space before it).
local NAME_WIDTH = { min = 16, max = 40 }
local PLACE_WIDTH = { min = 14, max = 60 }
local TIME_WIDTH = 11
local MIN_TREE_BAR = 4 -- narrower, a bar says little: the tree shows its times alone
local MIN_WIDTH = 60

-- The open float: {win, buf, origin (the window to jump in), targets = {[row] = {path, line}}}.
local open_float = nil

-- Lines made of pieces {text, highlight group or nil}; remembers the spans to highlight and
-- the source line each row jumps to.
local Sheet = {}
Sheet.__index = Sheet

local function new_sheet()
  return setmetatable({ lines = {}, spans = {}, targets = {} }, Sheet)
end

function Sheet:add(pieces, target)
  local text = ''
  for _, piece in ipairs(pieces) do
    if piece[2] then
      table.insert(self.spans, { #self.lines, #text, #text + #piece[1], piece[2] })
    end
    text = text .. piece[1]
  end
  table.insert(self.lines, text)
  self.targets[#self.lines] = target
end

local function pad(text, width)
  local missing = width - vim.fn.strdisplaywidth(text)
  return missing > 0 and text .. string.rep(' ', missing) or text
end

-- `text` cut to leave at least one space before the next column.
local function cell(text, width)
  if vim.fn.strdisplaywidth(text) >= width then
    text = vim.fn.strcharpart(text, 0, width - 2) .. '…'
  end
  return pad(text, width)
end

local function lpad(text, width)
  local missing = width - vim.fn.strdisplaywidth(text)
  return missing > 0 and string.rep(' ', missing) .. text or text
end

--- `path:line` in at most `width` cells: the middle of the path gives way first, so that the
--- file name and the line number always show ("examples/c…/model.py:19").
function M.shorten_place(path, line, width)
  local suffix = ':' .. line
  local text = path .. suffix
  if vim.fn.strdisplaywidth(text) <= width then
    return text
  end
  local name = vim.fs.basename(path)
  local head = path:sub(1, #path - #name)
  local room = width - vim.fn.strdisplaywidth(name .. suffix) - 2 -- 2: '…/'
  if room >= 1 and head ~= '' then
    return vim.fn.strcharpart(head, 0, room) .. '…/' .. name .. suffix
  end
  return '…' .. vim.fn.strcharpart(name .. suffix, vim.fn.strchars(name .. suffix) - width + 1)
end

--- `text` wrapped at word boundaries into lines of at most `width` cells (a word longer than a
--- line is cut), the lines after the first starting with `indent`.
-- Units that stay on their number's line when text wraps: `8.8 MiB`, never `8.8` / `MiB`.
local UNITS = { B = true, KiB = true, MiB = true, GiB = true, TiB = true, ms = true, s = true }

--- The words of `text`, a number and its unit as one.
local function words(text)
  local out = {}
  for word in text:gmatch('%S+') do
    local previous = out[#out]
    if previous and UNITS[word:gsub('[,.;:)]+$', '')] and previous:match('^%(?[%d.,]+$') then
      out[#out] = previous .. ' ' .. word
    else
      table.insert(out, word)
    end
  end
  return out
end

function M.wrap(text, width, indent)
  local lines, current = {}, ''
  for _, word in ipairs(words(text)) do
    local candidate = current == '' and word or (current .. ' ' .. word)
    if current ~= '' and vim.fn.strdisplaywidth(candidate) > width then
      table.insert(lines, current)
      candidate = indent .. word
    end
    while vim.fn.strdisplaywidth(candidate) > width do
      table.insert(lines, vim.fn.strcharpart(candidate, 0, width))
      candidate = indent .. vim.fn.strcharpart(candidate, width)
    end
    current = candidate
  end
  if current ~= '' then
    table.insert(lines, current)
  end
  return lines
end

local LABEL = 14 -- width of the section labels

-- A throughput that can be shown: positive and finite, else nil (shown as —).
local function sane(samples_per_second)
  if samples_per_second and samples_per_second > 0 and samples_per_second < math.huge then
    return samples_per_second
  end
  return nil
end

-- The fastest throughput any measurement of the document reached.
local function best_measured(document)
  local best = document.iteration.samples_per_second or 0
  for _, p in ipairs(state.predictions or {}) do
    if p.measured then
      best = math.max(best, p.measured.samples_per_second or 0)
    end
  end
  return best
end

-- Text beside a section's label (or beneath it, `label` nil), wrapped at word boundaries to the
-- float's width, its further lines beneath. The label is a header unless `label_hl` says otherwise.
local function add_text(sheet, width, label, text, hl, label_hl)
  for i, line in ipairs(M.wrap(text, width - LABEL, '')) do
    local first = i == 1 and label
    sheet:add({ { pad(first or '', LABEL), first and (label_hl or 'SkylineFloatHeader') or nil }, { line, hl } })
  end
end

local function add_beneath(sheet, width, text, hl)
  add_text(sheet, width, nil, text, hl)
end

-- The other tensors alive at the memory peak (the document's `peak_memory_operation.other_tensors`)
-- worth naming, as the terminal report names them: those holding at least this share of the peak.
local NOTABLE_TENANT = 0.05

--- `other tensors alive there from train.py:7: 15.6 MiB made in backward`; nil when none is notable.
local function peak_tenants(document, at, width)
  local least = NOTABLE_TENANT * document.iteration.peak_memory_bytes
  local kinds, places = {}, {} -- a line's tensors together, in the document's order (largest first)
  for _, tenant in ipairs(at.other_tensors or {}) do
    if tenant.bytes >= least then
      local place = M.shorten_place(tenant.path, tenant.line, width - LABEL)
      if not kinds[place] then
        kinds[place] = {}
        table.insert(places, place)
      end
      table.insert(
        kinds[place],
        format.bytes(tenant.bytes) .. ' ' .. (constants.TENSOR_KIND_LABELS[tenant.phase] or tenant.phase)
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

local function add_throughput(sheet, document, width)
  local measured = state.measured
  local throughput = format.throughput(measured.samples_per_second)
  local k = document.iteration.micro_batches or 1 -- gradient accumulation
  local summary = string.format('%s measured at batch size %d', throughput, measured.batch_size)
    .. (k > 1 and string.format(' × %d micro-batches per optimizer step', k) or '')
  add_text(sheet, width, 'Throughput', summary)
  local fitted = state.models
  local knee = fitted and fitted.throughput_knee_batch_size
  -- A limit below what was measured contradicts the measurements: not shown.
  local consistent = fitted and (fitted.asymptotic_samples_per_second or 0) >= best_measured(document)
  if knee and consistent then
    -- Where more samples stop buying throughput: 90% of what the model says it approaches.
    local low, high = unpack(fitted.trusted_range)
    local text = string.format(
      'knee: %s at batch size %s (90%% of %s)%s',
      format.throughput(fitted.throughput_knee_samples_per_second),
      format.integer(knee),
      format.throughput(fitted.asymptotic_samples_per_second),
      (knee < low or knee > high) and ', an extrapolation' or ''
    )
    add_beneath(sheet, width, text, 'SkylineFloatMuted')
  end
  local p = state.prediction
  if p and state.batch_size ~= document.batch_size then
    local text = string.format(
      '%s at batch size %d: %s, %s',
      p.measured and 'measured' or 'predicted',
      p.batch_size,
      format.throughput(sane(p.samples_per_second)),
      format.bytes(p.peak_memory_bytes)
    )
    sheet:add({
      { pad('', LABEL) },
      { text, p.fits and 'SkylineBatch' or 'SkylineBatchWarn' },
      { state.running and ' (measuring…)' or '', 'SkylineFloatMuted' },
    })
  end
end

-- torch.compile: what it compiled (not in the iteration's time), and where the lines come from.
local function add_compilation(sheet, document, width)
  local compilation = document.compilation
  if type(compilation) ~= 'table' then
    return
  end
  local text = "torch.compile: %d graph(s) in %.1f s, not in the iteration's time"
  add_text(sheet, width, 'Compiled', string.format(text, compilation.graphs, compilation.seconds))
  if document.attribution and document.attribution.mode == 'eager_replay' then
    add_beneath(sheet, width, 'per-line times from an eager run of the iteration', 'SkylineFloatMuted')
  end
end

-- The phase that reached the peak, as the float names it: an iteration whose recording has no
-- backward work (inference, evaluation) has a forward pass, not a forward and backward one.
local function phase_name(document, phase)
  local operations = document.operations
  if phase == constants.FORWARD_BACKWARD and not (operations and (operations.backward_ms or 0) > 0) then
    return constants.FORWARD_ONLY_LABEL
  end
  return constants.PEAK_PHASE_LABELS[phase]
end

local function sum(list, field)
  local total = 0
  for _, item in ipairs(list or {}) do
    total = total + (item[field] or 0)
  end
  return total
end

-- Peak memory against the device's capacity, the phase that reaches it, and its parts.
local function add_memory(sheet, document, width)
  local device = document.device
  local capacity = device.memory_capacity_bytes
  local iteration = document.iteration
  local peak = iteration.peak_memory_bytes
  local phase = phase_name(document, iteration.peak_memory_phase)
  local figures = string.format(' %s of %s', format.bytes(peak), format.bytes(capacity))
  local on = string.format('(%s, %s)', device.type, device.name)
  local one_line = LABEL + 2 * BAR + vim.fn.strdisplaywidth(figures .. ' ' .. on) <= width
  sheet:add({
    { pad('Memory', LABEL), 'SkylineFloatHeader' },
    { format.bar(peak / capacity, 2 * BAR), 'SkylineFloatMemory' },
    { one_line and figures .. ' ' .. on or figures },
  })
  if not one_line then -- a narrow editor: the device beneath
    add_beneath(sheet, width, on)
  end
  if phase then
    local at = document.peak_memory_operation
    local where = ''
    if at and at.path then -- where the recorded iteration's memory peaked
      local place = M.shorten_place(at.path, at.line, width - LABEL) -- a long path gives way in the middle
      where = string.format(', at %s (%s%s)', place, at.operation, at.phase == 'backward' and ', backward' or '')
    end
    add_beneath(sheet, width, 'peak reached in ' .. phase .. where, 'SkylineFloatMuted')
    local tenants = at and at.path and peak_tenants(document, at, width)
    if tenants then
      add_beneath(sheet, width, tenants, 'SkylineFloatMuted')
    end
  end
  local reserved = iteration.peak_memory_reserved_bytes -- CUDA only: the peak plus the allocator's cache
  if type(reserved) == 'number' then
    sheet:add({ { pad('', LABEL) }, { 'the allocator reserved ' .. format.bytes(reserved), 'SkylineFloatMuted' } })
  end
  local parts = {
    { 'weights', sum(document.weights, 'size_bytes') },
    { 'gradients', sum(document.weights, 'grad_size_bytes') },
    { 'optimizer', sum(document.optimizer_state, 'size_bytes') },
    { 'activations', document.operations and document.operations.activation_bytes or 0 },
    { 'untracked', document.untracked and document.untracked.memory_bytes or 0 },
  }
  for _, part in ipairs(parts) do
    sheet:add({
      { pad('  ' .. part[1], LABEL), 'SkylineFloatMuted' },
      { format.bar(part[2] / capacity, 2 * BAR), 'SkylineFloatMemory' },
      { ' ' .. format.bytes(part[2]) },
    })
  end
  -- CUDA: the untracked memory holds cuBLAS's workspaces, which no tensor holds (absent from earlier documents).
  local workspaces = document.untracked and document.untracked.workspace_bytes
  if type(workspaces) == 'number' and workspaces > 0 then
    sheet:add({ { pad('', LABEL) }, { format.bytes(workspaces) .. ' of it cuBLAS workspaces', 'SkylineFloatMuted' } })
  end
end

-- The rows of the chart: the document's predictions, a measured batch size showing its
-- measurement, one outside the trusted range marked as an extrapolation; the current batch size,
-- when the document has no row for it, predicted with the models' formula. Sorted by batch size.
local function chart_rows(document)
  local rows, current = {}, state.batch_size
  local has_current = false
  for _, p in ipairs(state.predictions or {}) do
    local shown = p.measured or p
    if p.batch_size == document.batch_size then
      shown = state.measured -- one figure per batch size: the latest measurement of it
    end
    table.insert(rows, {
      batch_size = p.batch_size,
      samples_per_second = sane(shown.samples_per_second),
      peak_memory_bytes = shown.peak_memory_bytes,
      fits = shown ~= p or p.fits, -- a measured batch size ran: it fits
      measured = shown ~= p,
      extrapolated = p.extrapolated and shown == p,
      largest = p.batch_size == state.models.max_batch_size,
    })
    has_current = has_current or p.batch_size == current
  end
  if current and not has_current then
    local row = current == document.batch_size and vim.tbl_extend('force', state.measured, { measured = true })
      or models.at(state.models, current)
    row.samples_per_second = sane(row.samples_per_second)
    table.insert(rows, row)
  end
  table.sort(rows, function(a, b)
    return a.batch_size < b.batch_size
  end)
  return rows
end

-- What a chart row is, as the terminal report's table says it: measured, the largest predicted
-- to fit, an extrapolation.
local function notes(row)
  local said = {}
  if row.measured then
    table.insert(said, 'measured')
  end
  if row.largest then
    table.insert(said, 'largest fit')
  end
  if row.extrapolated then
    table.insert(said, 'extrapolated')
  end
  return #said > 0 and '  ' .. table.concat(said, ', ') or ''
end

-- Throughput and peak memory over the batch sizes of the analysis, and the current one, within
-- `width`: in a narrow editor the bars give way.
local function add_chart(sheet, document, width)
  if not state.models then
    return
  end
  local rows, top_speed, top_memory = chart_rows(document), 0, 0
  for _, row in ipairs(rows) do
    top_speed = math.max(top_speed, row.samples_per_second or 0)
    top_memory = math.max(top_memory, row.peak_memory_bytes or 0)
  end
  local noted, longest = {}, 0
  for i, row in ipairs(rows) do
    noted[i] = notes(row)
    longest = math.max(longest, vim.fn.strdisplaywidth(noted[i] .. (row.fits == false and '  does not fit' or '')))
  end
  -- The columns: '▸ ', the batch size (10) and 2, a bar, the throughput (1 + 11), a bar, the memory (12).
  local bar = math.max(4, math.min(BAR, math.floor((width - 38 - longest) / 2)))
  sheet:add({})
  local header = pad('Batch size', 14) .. pad('samples/s', bar + 12) .. 'peak memory'
  sheet:add({ { header, 'SkylineFloatHeader' } })
  for i, row in ipairs(rows) do
    local is_current = row.batch_size == state.batch_size
    local speed = row.samples_per_second
    local memory = ' ' .. format.bytes(row.peak_memory_bytes)
    local note = noted[i]
    sheet:add({
      { is_current and '▸ ' or '  ', is_current and 'SkylineFloatCurrent' or nil },
      { lpad(format.integer(row.batch_size), 10) .. '  ', is_current and 'SkylineFloatCurrent' or nil },
      { speed and top_speed > 0 and format.bar(speed / top_speed, bar) or string.rep(' ', bar), 'SkylineFloatForward' },
      { ' ' .. pad(format.integer(speed), 11) },
      { format.bar(top_memory > 0 and (row.peak_memory_bytes or 0) / top_memory or 0, bar), 'SkylineFloatMemory' },
      { (note ~= '' or row.fits == false) and pad(memory, 12) or memory },
      { note, 'SkylineFloatMuted' },
      { row.fits == false and '  does not fit' or '', 'SkylineFloatWarn' },
    })
  end
end

local LINK_SOURCES = { measured = 'measured', user = 'as configured' }

-- Data parallel (a document with `distributed`): the ranks (the slowest marked), the all-reduce
-- time and how much of it is exposed, the link, and throughput over world sizes: the measured
-- one showing the measurement, one beyond what was run marked as an extrapolation.
local function add_distributed(sheet, document, width)
  local dp = document.distributed
  if not dp then
    return
  end
  sheet:add({})
  local threads = dp.threads_per_rank
      and string.format(' × %d thread%s', dp.threads_per_rank, dp.threads_per_rank == 1 and '' or 's')
    or ''
  sheet:add({
    { pad('Data parallel', LABEL), 'SkylineFloatHeader' },
    { string.format('%d ranks%s, %s', dp.world_size, threads, dp.backend or format.UNKNOWN) },
  })
  local slowest_ms = 0
  for _, rank in ipairs(dp.ranks or {}) do
    slowest_ms = math.max(slowest_ms, rank.run_time_ms or 0)
  end
  for _, rank in ipairs(dp.ranks or {}) do
    local run_time = rank.run_time_ms
    sheet:add({
      { pad('  rank ' .. rank.rank, LABEL), 'SkylineFloatMuted' },
      { format.bar(slowest_ms > 0 and (run_time or 0) / slowest_ms or 0, BAR), 'SkylineFloatForward' },
      { ' ' .. pad(run_time and format.ms(run_time) or format.UNKNOWN, 11) },
      { format.bytes(rank.peak_memory_bytes) },
      { rank.rank == dp.slowest_rank and '  slowest' or '', 'SkylineFloatWarn' },
    })
  end
  local comm = dp.communication
  if comm then
    local run_time, share = document.iteration.run_time_ms, ''
    if comm.exposed_ms and run_time and run_time > 0 then
      share = ' (' .. format.percent(comm.exposed_ms / run_time) .. ')'
    end
    local text = string.format(
      '%s exposed%s of %s, compute %s',
      comm.exposed_ms and format.ms(comm.exposed_ms) or format.UNKNOWN,
      share,
      comm.all_reduce_ms and format.ms(comm.all_reduce_ms) or format.UNKNOWN,
      comm.compute_ms and format.ms(comm.compute_ms) or format.UNKNOWN
    )
    add_text(sheet, width, '  all-reduce', text, nil, 'SkylineFloatMuted')
  end
  local link = dp.link
  if link then
    local figures = {}
    if link.latency_us then
      table.insert(figures, string.format('%.1f µs', link.latency_us))
    end
    if link.bandwidth_gbps then
      table.insert(figures, string.format('%.1f Gbit/s', link.bandwidth_gbps))
    end
    local text = string.format(
      '%s (%s)%s',
      link.description or format.UNKNOWN,
      LINK_SOURCES[link.source] or link.source or format.UNKNOWN,
      #figures > 0 and (': ' .. table.concat(figures, ', ')) or ''
    )
    add_text(sheet, width, '  link', text, nil, 'SkylineFloatMuted')
  end
  local rows, top_speed = dp.scaling or {}, 0
  if #rows == 0 then
    return
  end
  for _, row in ipairs(rows) do
    top_speed = math.max(top_speed, sane(row.measured_samples_per_second or row.samples_per_second) or 0)
  end
  sheet:add({})
  local header = pad('World size', 14) .. pad('samples/s', 2 * BAR + 2) .. pad('iteration', 11) .. 'exposed comm'
  sheet:add({ { header, 'SkylineFloatHeader' } })
  for _, row in ipairs(rows) do
    local is_current = row.world_size == dp.world_size
    local measured = row.measured_samples_per_second ~= nil
    local speed = sane(row.measured_samples_per_second or row.samples_per_second)
    local exposed = row.exposed_ms and format.ms(row.exposed_ms) or format.UNKNOWN
    local noted = measured or row.extrapolated
    sheet:add({
      { is_current and '▸ ' or '  ', is_current and 'SkylineFloatCurrent' or nil },
      { lpad(format.integer(row.world_size), 10) .. '  ', is_current and 'SkylineFloatCurrent' or nil },
      { speed and top_speed > 0 and format.bar(speed / top_speed, BAR) or string.rep(' ', BAR), 'SkylineFloatForward' },
      { ' ' .. pad(format.integer(speed), BAR + 1) },
      { pad(row.iteration_ms and format.ms(row.iteration_ms) or format.UNKNOWN, 11) },
      { noted and pad(exposed, 10) or exposed },
      { measured and '  measured' or (row.extrapolated and '  extrapolated' or ''), 'SkylineFloatMuted' },
    })
  end
end

-- The first frame of a node in a project file (not `<frozen …>` and the like).
local function place_of(node)
  for _, context in ipairs(node.contexts or {}) do
    if not context.path:match('^<') then
      return context
    end
  end
  return nil
end

-- The rows of the tree, depth first: {node, depth, place}, at most MAX_TREE_ROWS of them.
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

local function add_tree(sheet, document, width)
  local root = document.operations
  if not root then
    return
  end
  local phases = tree_phases(root)
  local total = 0
  for _, phase in ipairs(phases) do
    total = total + (root[phase.field] or 0)
  end
  total = math.max(total, 1e-9)
  local rows = tree_rows(root)
  -- Bars as long as the names at their narrowest and the places' file names and lines leave room
  -- for; none where that is under MIN_TREE_BAR cells (three phases at 80 columns: the times alone,
  -- and `entry_point.py:25` whole).
  local files = PLACE_WIDTH.min
  for _, row in ipairs(rows) do
    if row.place then
      local file = vim.fs.basename(row.place.path) .. ':' .. row.place.line
      files = math.max(files, vim.fn.strdisplaywidth(file) + 2)
    end
  end
  local room = math.floor((width - NAME_WIDTH.min - files) / #phases) - TIME_WIDTH
  local bar = room >= MIN_TREE_BAR and math.min(BAR, room) or 0
  local column = bar > 0 and bar + TIME_WIDTH or TIME_WIDTH - 1 -- a phase's cells
  local name_width, place_width, step = tree_columns(rows, width, #phases * column, files)
  sheet:add({})
  local header = pad('Operations', name_width + place_width)
  for i, phase in ipairs(phases) do
    header = header .. (i < #phases and pad(phase.title, column) or phase.title)
  end
  sheet:add({ { header, 'SkylineFloatHeader' } })
  for _, row in ipairs(rows) do
    local node, place = row.node, row.place
    local target = place and { path = project.absolute(state.request.root, place.path), line = place.line }
    local where = place and M.shorten_place(place.path, place.line, place_width - 2) or ''
    local pieces = {
      { cell(string.rep(' ', step * row.depth) .. node.name, name_width) },
      { pad(where, place_width), 'SkylineFloatMuted' },
    }
    -- The step column is blank where the node has no part in the update (most of the tree).
    local shown = (node.step_ms or 0) > 0 and #phases or 2
    for i = 1, shown do
      local ms = node[phases[i].field] or 0
      if bar > 0 then
        table.insert(pieces, { format.bar(ms / total, bar) .. ' ', phases[i].group })
      end
      table.insert(pieces, { i < shown and pad(format.ms(ms), TIME_WIDTH - 1) or format.ms(ms) })
    end
    sheet:add(pieces, target)
  end
end

local function add_warnings(sheet, document, width)
  if #(document.warnings or {}) == 0 then
    return
  end
  sheet:add({})
  for _, warning in ipairs(document.warnings) do
    for i, line in ipairs(M.wrap(warning, width - 2, '')) do
      sheet:add({ { (i == 1 and '! ' or '  ') .. line, 'SkylineFloatWarn' } })
    end
  end
end

-- The widest the float can be in this editor: its columns less the border and a margin.
local function available_width()
  return math.max(MIN_WIDTH, vim.o.columns - 4)
end

--- The float's content for the current results, for a float at most `width` cells wide.
local function build(width)
  local document = state.document
  local sheet = new_sheet()
  add_throughput(sheet, document, width)
  add_compilation(sheet, document, width)
  add_memory(sheet, document, width)
  add_chart(sheet, document, width)
  add_distributed(sheet, document, width)
  add_tree(sheet, document, width)
  add_warnings(sheet, document, width)
  return sheet
end

local function fill(buf, sheet)
  vim.bo[buf].modifiable = true
  vim.api.nvim_buf_set_lines(buf, 0, -1, false, sheet.lines)
  vim.bo[buf].modifiable = false
  vim.api.nvim_buf_clear_namespace(buf, ns, 0, -1)
  for _, span in ipairs(sheet.spans) do
    vim.api.nvim_buf_set_extmark(buf, ns, span[1], span[2], { end_col = span[3], hl_group = span[4] })
  end
end

local function layout(sheet)
  local width = MIN_WIDTH
  for _, line in ipairs(sheet.lines) do
    width = math.max(width, vim.fn.strdisplaywidth(line))
  end
  width = math.max(1, math.min(width + 1, vim.o.columns - 4))
  local height = math.max(1, math.min(#sheet.lines, vim.o.lines - 6))
  return {
    relative = 'editor',
    width = width,
    height = height,
    row = math.max(0, math.floor((vim.o.lines - height) / 2) - 1),
    col = math.max(0, math.floor((vim.o.columns - width) / 2)),
  }
end

local function border()
  local configured = config.get().float_border
  if configured then
    return configured
  end
  return vim.o.winborder == '' and 'rounded' or nil -- nil: 'winborder' applies
end

function M.is_open()
  return open_float ~= nil and vim.api.nvim_win_is_valid(open_float.win)
end

function M.close()
  local closing = open_float
  open_float = nil -- first: closing fires WinLeave, which calls close() again
  if closing and vim.api.nvim_win_is_valid(closing.win) then
    vim.api.nvim_win_close(closing.win, true)
  end
end

-- <CR>: go to the line the row names, in the window the float was opened from.
local function jump()
  local target = open_float.targets[vim.api.nvim_win_get_cursor(0)[1]]
  if not target then
    return
  end
  local origin = open_float.origin
  M.close()
  if vim.api.nvim_win_is_valid(origin) then
    vim.api.nvim_set_current_win(origin)
  end
  if project.buffer_path(vim.api.nvim_get_current_buf()) ~= target.path then
    vim.cmd.edit(vim.fn.fnameescape(target.path))
  end
  local last = vim.api.nvim_buf_line_count(0)
  vim.api.nvim_win_set_cursor(0, { math.min(target.line, last), 0 })
end

local function open()
  require('skyline.highlights').setup()
  local sheet = build(available_width())
  local buf = vim.api.nvim_create_buf(false, true)
  vim.bo[buf].bufhidden = 'wipe'
  fill(buf, sheet)
  vim.bo[buf].filetype = 'skyline-breakdown'
  local win_config = layout(sheet)
  win_config.style = 'minimal'
  win_config.border = border()
  win_config.title = { { ' Skyline: ' .. vim.fs.basename(state.request.entry) .. ' ', 'SkylineFloatTitle' } }
  win_config.title_pos = 'center'
  local origin = vim.api.nvim_get_current_win()
  local win = vim.api.nvim_open_win(buf, true, win_config)
  vim.wo[win].cursorline = true
  vim.wo[win].winhighlight = 'FloatBorder:SkylineFloatBorder'
  open_float = { win = win, buf = buf, origin = origin, targets = sheet.targets }
  for _, lhs in ipairs({ 'q', '<Esc>' }) do
    vim.keymap.set('n', lhs, M.close, { buffer = buf, nowait = true, desc = 'skyline: close the breakdown' })
  end
  vim.keymap.set('n', '<CR>', jump, { buffer = buf, nowait = true, desc = 'skyline: go to this line' })
  vim.api.nvim_create_autocmd('VimResized', {
    group = vim.api.nvim_create_augroup('skyline.float', { clear = true }),
    desc = 'skyline: lay the breakdown out again for the new size',
    callback = function()
      if not M.is_open() then
        return true -- closed: the autocommand goes too
      end
      M.refresh()
    end,
  })
  vim.api.nvim_create_autocmd('WinLeave', {
    buffer = buf,
    once = true,
    callback = function()
      vim.schedule(function() -- a window cannot be closed while it is being left
        if open_float and open_float.win == win then
          M.close()
        end
      end)
    end,
  })
end

--- :SkylineBreakdown: open the float, or close it when it is open.
function M.toggle()
  if M.is_open() then
    M.close()
  elseif not (state.document and state.document.iteration) then
    util.error('no results yet: run :SkylineProfile first')
  else
    open()
  end
end

--- Redraws an open float with the current results (a new document, a batch-size change).
function M.refresh()
  if not M.is_open() or not state.document then
    return
  end
  local sheet = build(available_width())
  fill(open_float.buf, sheet)
  open_float.targets = sheet.targets
  local win_config = layout(sheet)
  vim.api.nvim_win_set_config(open_float.win, win_config)
end

return M
