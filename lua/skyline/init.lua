-- skyline.nvim's public API. Nothing here is needed to use the plugin: plugin/skyline.lua
-- defines the commands and <Plug> maps, and the defaults apply without setup().
local M = {}

--- Validates and applies options (see :help skyline-options). On an invalid option it tells
--- the user which one and keeps the previous options; returns whether they were applied.
function M.setup(opts)
  local config = require('skyline.config')
  local util = require('skyline.util')
  local ok, result = config.apply(opts)
  if not ok then
    util.error('setup: ' .. result)
    return false
  end
  if #result > 0 then
    util.warn('setup: unknown options ignored: ' .. table.concat(result, ', '))
  end
  return true
end

--- Profiles `entry` (a path), or what :SkylineProfile without an argument would.
function M.profile(entry)
  require('skyline.commands').profile({ args = entry or '' })
end

function M.stop()
  require('skyline.profile').stop()
end

function M.clear()
  require('skyline.profile').clear()
end

function M.breakdown()
  require('skyline.float').toggle()
end

--- Sets the batch size: a number, or '+N', '-N', 'max' as :SkylineBatchSize takes them.
function M.batch_size(value)
  require('skyline.batch').set(tostring(value))
end

--- {batch_size, prediction, measured, stale, running, progress, error, entry_point,
--- analysis_id}: a copy, for statuslines and tests.
function M.state()
  return require('skyline.state').snapshot()
end

local function compact(value)
  if value == nil then
    return require('skyline.format').UNKNOWN -- a predicted run time that is not positive
  elseif value >= 1e6 then
    return string.format('%.1fM', value / 1e6)
  elseif value >= 1e3 then
    return string.format('%.1fk', value / 1e3)
  end
  return string.format('%.0f', value)
end

--- A short statusline item: progress while profiling (share done and phase), else the batch size with its throughput
--- and peak memory (`~` marks a prediction, where no analysis measured that batch size) and the recommended batch
--- size (`· use 512 (+26%)`, `· recommended` at it); '' before any result.
function M.status()
  local state = require('skyline.state')
  if state.running then
    local progress = state.progress or {}
    local text = string.format('skyline %d%%', math.floor((progress.fraction or 0) * 100))
    return progress.phase and (text .. ' ' .. progress.phase) or text
  end
  local measured = state.measured
  if not measured then
    return state.error and 'skyline: error' or ''
  end
  local shown, mark = measured, ''
  if state.batch_size ~= measured.batch_size then
    if not state.prediction then
      -- A new batch size nothing predicts (a training script without models): the re-profile measures it (the
      -- figures of the one measured would read as this one's).
      return string.format('skyline b=%d measuring', state.batch_size)
    end
    shown, mark = state.prediction, state.prediction.measured and '' or '~'
  end
  -- Where no time is predicted (past the samples per step), say so, not `~—/s`.
  local speed = shown.samples_per_second and (mark .. compact(shown.samples_per_second) .. '/s') or 'no time'
  local text = string.format(
    'skyline b=%d %s %s%s',
    state.batch_size,
    speed,
    mark,
    require('skyline.format').bytes(shown.peak_memory_bytes)
  )
  if shown.fits == false then
    text = text .. ' (does not fit)'
  end
  local advice = require('skyline.recommendation').short(state.models and state.models.recommendation, state.batch_size)
  if advice ~= '' then
    text = text .. ' · ' .. advice
  end
  if state.is_stale() then
    text = text .. ' (stale)'
  end
  return text
end

return M
