-- The document's warnings, each wrapped to the float's width after a `!`; then what the analysis
-- took from the previous one instead of measuring it (`reused`), after an `i`.
local layout = require('skyline.float.layout')

local M = {}

---@param sheet skyline.float.Sheet
---@param context skyline.float.Context
function M.render(sheet, context)
  local warnings = context.document.warnings or {}
  local reused = context.document.reused
  if #warnings == 0 and not reused then
    return
  end
  sheet:add({})
  local function add(text, mark, group)
    for i, line in ipairs(layout.wrap(text, context.width - 2, '')) do
      sheet:add({ { (i == 1 and mark or '  ') .. line, group } })
    end
  end
  for _, warning in ipairs(warnings) do
    add(warning, '! ', 'SkylineFloatWarn')
  end
  if reused then
    add(reused.reason, 'i ', 'SkylineFloatMuted')
  end
end

return M
