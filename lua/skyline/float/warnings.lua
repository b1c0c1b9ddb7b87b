-- The document's warnings, each wrapped to the float's width after a `!`.
local layout = require('skyline.float.layout')

local M = {}

---@param sheet skyline.float.Sheet
---@param context skyline.float.Context
function M.render(sheet, context)
  local warnings = context.document.warnings or {}
  if #warnings == 0 then
    return
  end
  sheet:add({})
  for _, warning in ipairs(warnings) do
    for i, line in ipairs(layout.wrap(warning, context.width - 2, '')) do
      sheet:add({ { (i == 1 and '! ' or '  ') .. line, 'SkylineFloatWarn' } })
    end
  end
end

return M
