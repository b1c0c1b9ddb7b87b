-- Per-line costs as virtual text, in the namespace `skyline`: forward + backward time, share
-- of the iteration and memory, graded by cost. Once a buffer with annotations changes, they
-- are dimmed (stale) until the next profile redraws them.
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

--- The text and highlight group of one record of the document's `lines`, or nil when the line
--- cost nothing. `totals` = {run_time_ms, peak_memory_bytes} of the iteration.
function M.annotation(record, totals)
  local format = require('skyline.format')
  local time = record.forward_ms + record.backward_ms
  local parts = {}
  if time > 0 then
    local share = time / totals.run_time_ms
    table.insert(parts, string.format('fwd %.2f + bwd %.2f ms', record.forward_ms, record.backward_ms))
    table.insert(parts, format.percent(share))
  end
  if record.memory_bytes > 0 then
    table.insert(parts, format.bytes(record.memory_bytes))
  end
  if #parts == 0 then
    return nil
  end
  local share = math.max(time / totals.run_time_ms, record.memory_bytes / totals.peak_memory_bytes)
  return table.concat(parts, ' · '), grade(share)
end

local function set_mark(buf, row, text, group, id)
  return vim.api.nvim_buf_set_extmark(buf, M.ns, row, 0, {
    id = id,
    virt_text = { { text, group } },
    virt_text_pos = config.get().virt_text_pos,
    hl_mode = 'combine',
    invalidate = true,
  })
end

--- Dims every annotation of `buf`: the code changed since they were measured.
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

-- The first change to an annotated buffer makes its annotations stale.
local function watch(buf)
  if watched[buf] then
    return
  end
  watched[buf] = true
  vim.api.nvim_buf_attach(buf, false, {
    on_lines = function()
      if not drawn[buf] then
        watched[buf] = nil
        return true -- detach: nothing left to mark
      end
      if not drawn[buf].stale then
        vim.schedule(function()
          M.mark_stale(buf)
        end)
      end
    end,
    on_detach = function()
      watched[buf] = nil
      drawn[buf] = nil
    end,
  })
end

--- Replaces the annotations of `buf` by `items` ({row, text, group} each).
function M.draw(buf, items, stale)
  highlights.setup()
  vim.api.nvim_buf_clear_namespace(buf, M.ns, 0, -1)
  for _, item in ipairs(items) do
    set_mark(buf, item.row, item.text, stale and 'SkylineStale' or item.group)
  end
  drawn[buf] = { stale = stale }
  watch(buf)
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
