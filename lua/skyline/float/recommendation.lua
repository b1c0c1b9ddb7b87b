-- The batch size to use: the document's one recommendation (`models.recommendation`), as the
-- terminal report's "Batch size" line says it, and why beneath it.
local recommendation = require('skyline.recommendation')

local M = {}

---@param sheet skyline.float.Sheet
---@param context skyline.float.Context
function M.render(sheet, context)
  local advice = recommendation.of(context.models)
  if not advice then
    return
  end
  sheet:add_text('Advice', recommendation.summary(advice, context.models_batch_size))
  if advice.reason then
    sheet:add_beneath(advice.reason, 'SkylineFloatMuted')
  end
end

return M
