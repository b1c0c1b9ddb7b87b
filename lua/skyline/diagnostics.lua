-- Engine errors that name a file and line (a user-code exception, a broken provider, a time
-- limit) become `vim.diagnostic` entries there, until the next profile starts.
local M = {}

M.ns = vim.api.nvim_create_namespace('skyline.diagnostics')

--- Shows `message` at `line` (1-based, as the engine counts) of `path`. `row_of(buf, line)`
--- maps the line to the buffer's current row when the buffer changed since the request.
function M.show(path, line, message, row_of)
  local buf = vim.fn.bufadd(path)
  local row = row_of(buf, line) or (line - 1)
  vim.diagnostic.set(M.ns, buf, {
    {
      lnum = row,
      col = 0,
      severity = vim.diagnostic.severity.ERROR,
      source = 'skyline',
      message = message,
    },
  })
end

function M.clear()
  vim.diagnostic.reset(M.ns)
end

return M
