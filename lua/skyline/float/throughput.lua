-- Throughput: measured at the document's batch size (with its micro-batches), the knee of the
-- batch-size models, and the figures at the batch size a key press set.
local format = require('skyline.format')
local layout = require('skyline.float.layout')

local M = {}

-- The fastest throughput any measurement of the document reached.
---@param context skyline.float.Context
local function best_measured(context)
  local best = context.document.iteration.samples_per_second or 0
  for _, p in ipairs(context.predictions or {}) do
    if p.measured then
      best = math.max(best, p.measured.samples_per_second or 0)
    end
  end
  return best
end

-- Where more samples stop buying throughput: 90% of what the models say it approaches. Nil where
-- the models have no knee, or a limit below what was measured, which contradicts the measurements.
---@param context skyline.float.Context
---@return string?
local function knee(context)
  local fitted = context.models
  local at = fitted and fitted.throughput_knee_batch_size
  local consistent = fitted and (fitted.asymptotic_samples_per_second or 0) >= best_measured(context)
  if not (at and consistent) then
    return nil
  end
  local low, high = unpack(fitted.trusted_range)
  return string.format(
    'knee: %s at batch size %s (90%% of %s)%s',
    format.throughput(fitted.throughput_knee_samples_per_second),
    format.integer(at),
    format.throughput(fitted.asymptotic_samples_per_second),
    (at < low or at > high) and ', an extrapolation' or ''
  )
end

---@param sheet skyline.float.Sheet
---@param context skyline.float.Context
function M.render(sheet, context)
  local measured = context.measured
  local k = context.document.iteration.micro_batches or 1 -- gradient accumulation
  local throughput = format.throughput(measured.samples_per_second)
  local summary = string.format('%s measured at batch size %d', throughput, measured.batch_size)
    .. (k > 1 and string.format(' × %d micro-batches per optimizer step', k) or '')
  sheet:add_text('Throughput', summary)
  local text = knee(context)
  if text then
    sheet:add_beneath(text, 'SkylineFloatMuted')
  end
  local p = context.prediction
  if p and context.batch_size ~= context.document.batch_size then
    text = string.format(
      '%s at batch size %d: %s, %s',
      p.measured and 'measured' or 'predicted',
      p.batch_size,
      format.throughput(layout.sane(p.samples_per_second)),
      format.bytes(p.peak_memory_bytes)
    )
    sheet:add({
      layout.label(''),
      { text, p.fits and 'SkylineBatch' or 'SkylineBatchWarn' },
      { context.running and ' (measuring…)' or '', 'SkylineFloatMuted' },
    })
  end
end

return M
