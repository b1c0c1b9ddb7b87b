-- Data parallel (a document with `distributed`): the ranks (the slowest marked), the all-reduce
-- time and how much of it is exposed, the link, and throughput over world sizes: the measured
-- one showing the measurement, one beyond what was run marked as an extrapolation.
local format = require('skyline.format')
local layout = require('skyline.float.layout')

local M = {}

local LINK_SOURCES = { measured = 'measured', user = 'as configured' }

-- `Data parallel` with the ranks, threads and backend, then each rank's time (a bar against the
-- slowest) and peak memory.
---@param sheet skyline.float.Sheet
---@param dp skyline.Distributed
local function add_ranks(sheet, dp)
  local threads = dp.threads_per_rank
      and string.format(' × %d thread%s', dp.threads_per_rank, dp.threads_per_rank == 1 and '' or 's')
    or ''
  sheet:add({
    layout.label('Data parallel', 'SkylineFloatHeader'),
    { string.format('%d ranks%s, %s', dp.world_size, threads, dp.backend or format.UNKNOWN) },
  })
  local slowest_ms = 0
  for _, rank in ipairs(dp.ranks or {}) do
    slowest_ms = math.max(slowest_ms, rank.run_time_ms or 0)
  end
  for _, rank in ipairs(dp.ranks or {}) do
    local run_time = rank.run_time_ms
    sheet:add({
      layout.label('  rank ' .. rank.rank, 'SkylineFloatMuted'),
      { format.bar(slowest_ms > 0 and (run_time or 0) / slowest_ms or 0, layout.BAR), 'SkylineFloatForward' },
      { ' ' .. layout.pad(run_time and format.ms(run_time) or format.UNKNOWN, 11) },
      { format.bytes(rank.peak_memory_bytes) },
      { rank.rank == dp.slowest_rank and '  slowest' or '', 'SkylineFloatWarn' },
    })
  end
end

-- The exposed all-reduce time (its share of the iteration), of the all-reduces' and the compute.
---@param sheet skyline.float.Sheet
---@param comm skyline.Communication
---@param run_time number? the iteration's
local function add_communication(sheet, comm, run_time)
  local share = ''
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
  sheet:add_text('  all-reduce', text, nil, 'SkylineFloatMuted')
end

-- The link the scaling plans for: what it is, where its figures come from, and those it has.
---@param sheet skyline.float.Sheet
---@param link skyline.Link
local function add_link(sheet, link)
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
  sheet:add_text('  link', text, nil, 'SkylineFloatMuted')
end

-- Throughput over world sizes, a bar against the fastest, the iteration and the exposed
-- communication; the current world size marked.
---@param sheet skyline.float.Sheet
---@param dp skyline.Distributed
local function add_scaling(sheet, dp)
  local rows, top_speed = dp.scaling or {}, 0
  if #rows == 0 then
    return
  end
  for _, row in ipairs(rows) do
    top_speed = math.max(top_speed, layout.sane(row.measured_samples_per_second or row.samples_per_second) or 0)
  end
  local pad, BAR = layout.pad, layout.BAR
  sheet:add({})
  local header = pad('World size', 14) .. pad('samples/s', 2 * BAR + 2) .. pad('iteration', 11) .. 'exposed comm'
  sheet:add({ { header, 'SkylineFloatHeader' } })
  for _, row in ipairs(rows) do
    local measured = row.measured_samples_per_second ~= nil
    local speed = layout.sane(row.measured_samples_per_second or row.samples_per_second)
    local exposed = row.exposed_ms and format.ms(row.exposed_ms) or format.UNKNOWN
    local noted = measured or row.extrapolated
    local mark, number = layout.row_head(row.world_size, row.world_size == dp.world_size)
    sheet:add({
      mark,
      number,
      { speed and top_speed > 0 and format.bar(speed / top_speed, BAR) or string.rep(' ', BAR), 'SkylineFloatForward' },
      { ' ' .. pad(format.integer(speed), BAR + 1) },
      { pad(row.iteration_ms and format.ms(row.iteration_ms) or format.UNKNOWN, 11) },
      { noted and pad(exposed, 10) or exposed },
      { measured and '  measured' or (row.extrapolated and '  extrapolated' or ''), 'SkylineFloatMuted' },
    })
  end
end

---@param sheet skyline.float.Sheet
---@param context skyline.float.Context
function M.render(sheet, context)
  local dp = context.document.distributed
  if not dp then
    return
  end
  sheet:add({})
  add_ranks(sheet, dp)
  if dp.communication then
    add_communication(sheet, dp.communication, context.document.iteration.run_time_ms)
  end
  if dp.link then
    add_link(sheet, dp.link)
  end
  add_scaling(sheet, dp)
end

return M
