-- The batch size to use: the analysis document's one recommendation (`models.recommendation`,
-- made by the engine: skyline_engine/predict/recommendation.py), in the words every part of the
-- editor shows it with (the float, the statusline item, the batch-size keys' hint), as the
-- terminal report's "Batch size" line says it. Nothing here decides anything.
local format = require('skyline.format')

local M = {}

--- The recommendation of `models`, or nil (no models, or a document from before it).
---@param models skyline.Models?
---@return skyline.Recommendation?
function M.of(models)
  return models and models.recommendation or nil
end

--- How much faster the recommended batch size ran than yours, timed beside it: `26% faster
--- than`, or `2.0×` from twice as fast. Nil without a recommended batch size.
---@param advice skyline.Recommendation
---@return string?
function M.compared(advice)
  local rate, yours = advice.samples_per_second, advice.users_samples_per_second
  if not (advice.batch_size and rate and yours and yours > 0) then
    return nil
  end
  local ratio = rate / yours
  if ratio >= 2 then
    return string.format('%.1f×', ratio)
  end
  return string.format('%d%% faster than', math.floor((ratio - 1) * 100 + 0.5))
end

--- `use 512 for 58,514 samples/s (measured), 26% faster than yours (128) timed beside it`, or
--- `none to recommend`; `yours`: the batch size of the document the recommendation came from.
---@param advice skyline.Recommendation
---@param yours integer?
---@return string
function M.summary(advice, yours)
  if not advice.batch_size then
    return 'none to recommend'
  end
  local text = string.format(
    'use %s for %s (%s)',
    format.integer(advice.batch_size),
    format.throughput(advice.samples_per_second),
    advice.measured and 'measured' or 'predicted'
  )
  local compared = M.compared(advice)
  if compared then
    local whose = yours and string.format('yours (%s)', format.integer(yours)) or 'yours'
    -- `timed`: absent from documents before the field, whose comparisons were all side by side.
    text = text .. string.format(', %s %s %s', compared, whose, advice.timed or 'timed beside it')
  end
  return text
end

--- The short form for a statusline: `use 512 (+26%)`, `recommended` at it, '' without one.
---@param advice skyline.Recommendation?
---@param batch_size integer? the batch size shown
---@return string
function M.short(advice, batch_size)
  if not (advice and advice.batch_size) then
    return ''
  end
  if batch_size == advice.batch_size then
    return 'recommended'
  end
  local ratio = (advice.samples_per_second or 0) / (advice.users_samples_per_second or math.huge)
  local gain = ratio >= 2 and string.format('%.1f×', ratio)
    or string.format('+%d%%', math.floor((ratio - 1) * 100 + 0.5))
  return string.format('use %s (%s)', format.integer(advice.batch_size), gain)
end

--- Where a change of batch size from `from` to `to` goes, with respect to the recommended batch
--- size: 'at' it, 'towards' it (nearer, by ratio: batch sizes go by doubling), 'away' from it;
--- nil without one, or when `to` is `from`.
---@param advice skyline.Recommendation?
---@param from integer
---@param to integer
---@return ('at'|'towards'|'away')?
function M.direction(advice, from, to)
  local target = advice and advice.batch_size
  if not target or to == from then
    return nil
  end
  if to == target then
    return 'at'
  end
  local function distance(b)
    return math.abs(math.log(math.max(b, 1) / target))
  end
  return distance(to) < distance(from) and 'towards' or 'away'
end

return M
