-- Engine errors that name a file and line (a user-code exception, a broken provider, a time
-- limit) become `vim.diagnostic` entries there, spanning the statement, with the full message,
-- until the next profile starts; so do warnings at the lines whose tensors an iteration keeps for
-- good (memory that grows with every iteration).
local config = require('skyline.config')
local format = require('skyline.format')

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

-- The diagnostic spanning the statement at `line` (1-based) of `path`, and its buffer and row.
local function diagnostic_at(path, line, severity, message, row_of)
  local buf = vim.fn.bufadd(path)
  local row = row_of(buf, line) or (line - 1)
  local span = M.statement_span(text_of(buf, path), row)
  return buf, row, vim.tbl_extend('force', span, { severity = severity, source = 'skyline', message = message })
end

local function set(buf, diagnostics)
  vim.diagnostic.config({ signs = { priority = config.get().priorities.signs } }, M.ns)
  vim.diagnostic.set(M.ns, buf, diagnostics)
end

--- Shows `message` at `line` (1-based, as the engine counts) of `path`. `row_of(buf, line)`
--- maps the line to the buffer's current row when the buffer changed since the request.
--- Returns the buffer and the row.
function M.show(path, line, message, row_of)
  local buf, row, diagnostic = diagnostic_at(path, line, vim.diagnostic.severity.ERROR, message, row_of)
  set(buf, { diagnostic })
  return buf, row
end

--- Warns at each line of the document's `memory_growth` (tensor memory each iteration keeps for
--- good) that its tensors stay alive. `absolute(path)` makes a document's path absolute.
function M.show_growth(growth, absolute, row_of)
  local by_buf = {}
  for _, kept in ipairs(growth.lines or {}) do
    if kept.path and kept.line and not kept.path:match('^<') then
      local message = string.format(
        'tensors made here stay alive after every iteration: %s of the %s by which memory grows each '
          .. 'iteration (keep no tensors across iterations: `loss.item()`, `output.detach()`)',
        format.bytes(kept.bytes),
        format.bytes(growth.bytes_per_iteration)
      )
      local buf, _, diagnostic =
        diagnostic_at(absolute(kept.path), kept.line, vim.diagnostic.severity.WARN, message, row_of)
      by_buf[buf] = by_buf[buf] or {}
      table.insert(by_buf[buf], diagnostic)
    end
  end
  for buf, diagnostics in pairs(by_buf) do
    set(buf, diagnostics)
  end
end

function M.clear()
  vim.diagnostic.reset(M.ns)
end

return M
