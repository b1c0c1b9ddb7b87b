-- Highlight groups, linked with `default = true` so a colour scheme or the user can override
-- them, and re-linked after every :colorscheme (which clears links it does not set).
local M = {}

M.GROUPS = {
  { 'SkylineCostLow', 'Comment', 'per-line cost below `cost_thresholds.mid`' },
  { 'SkylineCostMid', 'DiagnosticWarn', 'per-line cost from `cost_thresholds.mid`' },
  { 'SkylineCostHigh', 'DiagnosticError', 'per-line cost from `cost_thresholds.high`' },
  { 'SkylineStale', 'NonText', 'annotations of a buffer edited since its profile' },
  { 'SkylineBatch', 'DiagnosticInfo', 'the prediction next to the batch_size literal' },
  { 'SkylineBatchWarn', 'DiagnosticError', 'a batch size predicted not to fit in memory' },
  { 'SkylineFloatTitle', 'FloatTitle', "the breakdown float's title" },
  { 'SkylineFloatBorder', 'FloatBorder', "the breakdown float's border" },
  { 'SkylineFloatHeader', 'Title', 'section headings in the breakdown float' },
  { 'SkylineFloatMuted', 'Comment', 'secondary text in the breakdown float' },
  { 'SkylineFloatForward', 'DiagnosticInfo', 'forward-pass bars' },
  { 'SkylineFloatBackward', 'DiagnosticHint', 'backward-pass bars' },
  { 'SkylineFloatStep', 'Special', "the update's bars (optimizer steps, clipping)" },
  { 'SkylineFloatMemory', 'DiagnosticOk', 'memory bars' },
  { 'SkylineFloatCurrent', 'CursorLine', 'the current batch size in the chart' },
  { 'SkylineFloatWarn', 'DiagnosticWarn', 'warnings in the breakdown float' },
}

local function link_all()
  for _, group in ipairs(M.GROUPS) do
    vim.api.nvim_set_hl(0, group[1], { link = group[2], default = true })
  end
end

local done = false

--- Defines the groups once per session; later calls do nothing.
function M.setup()
  if done then
    return
  end
  done = true
  link_all()
  vim.api.nvim_create_autocmd('ColorScheme', {
    group = vim.api.nvim_create_augroup('skyline.highlights', { clear = true }),
    callback = link_all,
    desc = 'skyline: re-link highlight groups',
  })
end

return M
