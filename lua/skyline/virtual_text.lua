-- Per-line costs as virtual text, in the namespace `skyline`: each line's own forward + backward
-- time (or its optimizer-step time), share of the iteration, exposed all-reduce time (data
-- parallel) and memory, graded by cost, and, per the `costs` option, the cost of everything the
-- line calls into. Once a buffer with annotations changes, the edited lines lose theirs and the
-- others are dimmed (stale) until the next result.
local config = require('skyline.config')
local highlights = require('skyline.highlights')

local M = {}

M.ns = vim.api.nvim_create_namespace('skyline')

-- buf -> {stale = bool}, for buffers holding annotations; watched[buf] while attached.
local drawn = {}
local watched = {}

local function grade(share)
  local thresholds = config.get().cost_thresholds
  if share >= thresholds.high then
    return 'SkylineCostHigh'
  elseif share >= thresholds.mid then
    return 'SkylineCostMid'
  end
  return 'SkylineCostLow'
end

-- Below this, two times print the same at two decimals: a caller's total that adds nothing to
-- its own cost is not repeated.
local SAME_MS = 0.005

local function time_text(record)
  local forward, backward, step = record.forward_ms, record.backward_ms, record.step_ms or 0
  local parts = {}
  -- A phase with no work at all is left out (a line under no_grad has no backward: `+ bwd 0.00`
  -- read as a measurement); one that rounds to 0.00 ms is shown, as it ran.
  if forward > 0 and backward > 0 then
    table.insert(parts, string.format('fwd %.2f + bwd %.2f ms', forward, backward))
  elseif forward > 0 then
    table.insert(parts, string.format('fwd %.2f ms', forward))
  elseif backward > 0 then
    table.insert(parts, string.format('bwd %.2f ms', backward))
  end
  if step > 0 then
    table.insert(parts, string.format('step %.2f ms', step))
  end
  return table.concat(parts, ' · ')
end

local function inclusive_ms(record)
  local inclusive = record.inclusive
  if not inclusive then
    return nil
  end
  return inclusive.forward_ms + inclusive.backward_ms + (inclusive.step_ms or 0)
end

--- The text and highlight group of one record of the document's `lines`, or nil when there is
--- nothing to show. `totals` = {run_time_ms, peak_memory_bytes} of the iteration; `costs`:
--- 'self' (the line's own operations), 'inclusive' (everything beneath the line too) or 'both'
--- (its own, and its total where that is more).
function M.annotation(record, totals, costs)
  local format = require('skyline.format')
  local own = record.forward_ms + record.backward_ms + (record.step_ms or 0)
  local total = inclusive_ms(record) or own
  local parts = {}
  if costs == 'inclusive' then
    if total > 0 then
      table.insert(parts, string.format('total %.2f ms', total))
      table.insert(parts, format.percent(total / totals.run_time_ms))
    end
  else
    if own > 0 then
      table.insert(parts, time_text(record))
      table.insert(parts, format.percent(own / totals.run_time_ms))
    end
    if costs == 'both' and total > own + SAME_MS then
      table.insert(parts, string.format('with calls %.2f ms (%s)', total, format.percent(total / totals.run_time_ms)))
    end
  end
  -- Data parallel: the all-reduce time the line's gradients leave exposed (not hidden behind backward).
  local communication = record.communication_ms or 0
  if communication > 0 then
    table.insert(parts, 'comm ' .. format.ms(communication))
  end
  if record.memory_bytes > 0 then
    table.insert(parts, format.bytes(record.memory_bytes))
  end
  if #parts == 0 then
    return nil
  end
  -- The grade marks where time goes: by the line's own cost (with the communication it waits
  -- for), unless only totals are shown.
  local graded = (costs == 'inclusive' and total or own) + communication
  local share = math.max(graded / totals.run_time_ms, record.memory_bytes / totals.peak_memory_bytes)
  return table.concat(parts, ' · '), grade(share)
end

local function set_mark(buf, row, text, group, id)
  return vim.api.nvim_buf_set_extmark(buf, M.ns, row, 0, {
    id = id,
    virt_text = { { text, group } },
    virt_text_pos = config.get().virt_text_pos,
    priority = config.get().priorities.virt_text,
    hl_mode = 'combine',
    invalidate = true,
  })
end

--- Dims every annotation of `buf`: the code changed since they were measured, or the last
--- profile failed.
function M.mark_stale(buf)
  if not drawn[buf] or drawn[buf].stale or not vim.api.nvim_buf_is_valid(buf) then
    return
  end
  drawn[buf].stale = true
  for _, mark in ipairs(vim.api.nvim_buf_get_extmarks(buf, M.ns, 0, -1, { details = true })) do
    local id, row, details = mark[1], mark[2], mark[4]
    set_mark(buf, row, details.virt_text[1][1], 'SkylineStale', id)
  end
end

--- Removes the annotations of rows `first` to `last` (0-based, inclusive) of `buf`: they describe
--- code that is no longer there.
function M.hide_rows(buf, first, last)
  if not vim.api.nvim_buf_is_valid(buf) then
    return
  end
  for _, mark in ipairs(vim.api.nvim_buf_get_extmarks(buf, M.ns, { first, 0 }, { last, -1 }, {})) do
    vim.api.nvim_buf_del_extmark(buf, M.ns, mark[1])
  end
end

-- A change to an annotated buffer dims its annotations and removes those of the edited lines.
local function watch(buf)
  if watched[buf] then
    return
  end
  watched[buf] = true
  vim.api.nvim_buf_attach(buf, false, {
    on_lines = function(_, _, _, first, _, new_last)
      if not drawn[buf] then
        watched[buf] = nil
        return true -- detach: nothing left to mark
      end
      vim.schedule(function() -- extmarks are not changed from inside on_lines
        M.hide_rows(buf, first, math.max(first, new_last - 1))
        M.mark_stale(buf)
      end)
    end,
    on_detach = function()
      watched[buf] = nil
      drawn[buf] = nil
    end,
  })
end

--- Whether :SkylineToggle hid the annotations of `buf`.
function M.hidden(buf)
  return vim.b[buf].skyline_hidden == true
end

--- Replaces the annotations of `buf` by `items` ({row, text, group} each); none while the buffer
--- has them hidden.
function M.draw(buf, items, stale)
  highlights.setup()
  vim.api.nvim_buf_clear_namespace(buf, M.ns, 0, -1)
  if not M.hidden(buf) then
    for _, item in ipairs(items) do
      set_mark(buf, item.row, item.text, stale and 'SkylineStale' or item.group)
    end
  end
  drawn[buf] = { stale = stale }
  watch(buf)
end

--- Dims the annotations of every buffer (the last profile failed) and removes those at `rows`
--- ({[buf] = row}: the lines where it failed).
function M.mark_all_stale(rows)
  for buf in pairs(drawn) do
    if vim.api.nvim_buf_is_valid(buf) then
      if rows[buf] then
        M.hide_rows(buf, rows[buf], rows[buf])
      end
      M.mark_stale(buf)
    end
  end
end

function M.clear_all()
  for buf in pairs(drawn) do
    if vim.api.nvim_buf_is_valid(buf) then
      vim.api.nvim_buf_clear_namespace(buf, M.ns, 0, -1)
    end
    drawn[buf] = nil
  end
end

function M.any_stale()
  for buf, info in pairs(drawn) do
    if info.stale and vim.api.nvim_buf_is_valid(buf) then
      return true
    end
  end
  return false
end

return M
