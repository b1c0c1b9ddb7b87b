-- Engine errors that name a file and line (a user-code exception, a broken provider, a time
-- limit) become `vim.diagnostic` entries there, spanning the statement, with the full message,
-- until the next profile starts.
local config = require('skyline.config')

local M = {}

M.ns = vim.api.nvim_create_namespace('skyline.diagnostics')

-- The text of `buf` when loaded, else of the file at `path`.
local function text_of(buf, path)
  if vim.api.nvim_buf_is_loaded(buf) then
    return vim.api.nvim_buf_get_lines(buf, 0, -1, false)
  end
  local ok, lines = pcall(vim.fn.readfile, path)
  return ok and lines or {}
end

-- How many brackets `text` leaves open (strings and comments skipped, roughly: enough to follow
-- a call or a literal over its lines).
local function open_brackets(text)
  local depth = 0
  local code = text:gsub([["[^"]*"]], ''):gsub([['[^']*']], ''):gsub('#.*$', '')
  for char in code:gmatch('[%(%)%[%]{}]') do
    depth = depth + (char:match('[%(%[{]') and 1 or -1)
  end
  return depth
end

--- The statement starting at `row` (0-based) of `lines`: {lnum, col, end_lnum, end_col}, from
--- its first non-blank character to the end of its last line (a bracket left open continues it).
function M.statement_span(lines, row)
  local text = lines[row + 1]
  if not text then
    return { lnum = row, col = 0, end_lnum = row, end_col = 0 }
  end
  local last, depth = row, open_brackets(text)
  while (depth > 0 or lines[last + 1]:match('\\$')) and lines[last + 2] do
    last = last + 1
    depth = depth + open_brackets(lines[last + 1])
  end
  return {
    lnum = row,
    col = (text:find('%S') or 1) - 1,
    end_lnum = last,
    end_col = #lines[last + 1],
  }
end

--- Shows `message` at `line` (1-based, as the engine counts) of `path`. `row_of(buf, line)`
--- maps the line to the buffer's current row when the buffer changed since the request.
--- Returns the buffer and the row.
function M.show(path, line, message, row_of)
  local buf = vim.fn.bufadd(path)
  local row = row_of(buf, line) or (line - 1)
  local span = M.statement_span(text_of(buf, path), row)
  vim.diagnostic.config({ signs = { priority = config.get().priorities.signs } }, M.ns)
  vim.diagnostic.set(M.ns, buf, {
    vim.tbl_extend('force', span, {
      severity = vim.diagnostic.severity.ERROR,
      source = 'skyline',
      message = message,
    }),
  })
  return buf, row
end

function M.clear()
  vim.diagnostic.reset(M.ns)
end

return M
