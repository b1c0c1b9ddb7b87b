-- torch.compile: what it compiled (not in the iteration's time), and where the lines come from.
local M = {}

---@param sheet skyline.float.Sheet
---@param context skyline.float.Context
function M.render(sheet, context)
  local document = context.document
  local compilation = document.compilation
  if type(compilation) ~= 'table' then
    return
  end
  local text = "torch.compile: %d graph(s) in %.1f s, not in the iteration's time"
  sheet:add_text('Compiled', string.format(text, compilation.graphs, compilation.seconds))
  if document.attribution and document.attribution.mode == 'eager_replay' then
    sheet:add_beneath('per-line times from an eager run of the iteration', 'SkylineFloatMuted')
  end
end

return M
