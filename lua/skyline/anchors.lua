-- Where a profiled line is in its buffer now.
--
-- The engine reads the files from disk and answers seconds later, in the files' line numbers.
-- At request time every line of each open project buffer gets an invisible mark; marks follow
-- edits, and a deleted line's mark is invalidated, so a result is drawn at the line it
-- describes wherever that line has moved, or not at all. A buffer with unsaved changes is first
-- matched against its file with a diff: lines the buffer changed are marked too (a changed line
-- is still that line), and the buffer counts as different from what was profiled.
local literal = require('skyline.literal')

local M = {}

M.ns = vim.api.nvim_create_namespace('skyline.anchor')

-- The text to diff: the batch_size literal may differ from the file on purpose (requests pass
-- the buffer's value), so its digits are masked.
local function joined(lines)
  local found = literal.find(lines)
  if found then
    lines = vim.list_slice(lines)
    local text = lines[found.row + 1]
    lines[found.row + 1] = text:sub(1, found.col_start) .. '#' .. text:sub(found.col_end + 1)
  end
  return table.concat(lines, '\n') .. '\n'
end

--- File line → buffer line (both 1-based) for a file whose lines are `file` shown in a buffer
--- whose lines are `current`, plus whether the two texts differ (beyond the batch_size literal).
--- A changed line keeps its mapping when the hunk changes as many lines as it replaces; lines of
--- other hunks have none.
function M.file_to_buffer(file, current)
  local hunks = vim.diff(joined(file), joined(current), { result_type = 'indices' })
  local map, offset, next_line = {}, 0, 1
  for _, hunk in ipairs(hunks) do
    local start_a, count_a, start_b, count_b = unpack(hunk)
    -- An empty side names the line before the change.
    local first_a = count_a == 0 and start_a + 1 or start_a
    local first_b = count_b == 0 and start_b + 1 or start_b
    for line = next_line, first_a - 1 do
      map[line] = line + offset
    end
    if count_a == count_b then
      for k = 0, count_a - 1 do
        map[first_a + k] = first_b + k
      end
    end
    next_line = first_a + count_a
    offset = first_b + count_b - next_line
  end
  for line = next_line, #file do
    map[line] = line + offset
  end
  return map, #hunks > 0
end

--- Marks the lines of `buf`, which shows `path`, for a new request.
--- Returns the anchor: {marks = {[file line] = mark id}, differs = unsaved changes were seen}.
function M.place(buf, path)
  vim.api.nvim_buf_clear_namespace(buf, M.ns, 0, -1)
  local current = vim.api.nvim_buf_get_lines(buf, 0, -1, false)
  local file_lines, map, differs = #current, nil, false
  if vim.bo[buf].modified then
    local ok, file = pcall(vim.fn.readfile, path)
    file = ok and file or {} -- never written: nothing of it is profiled
    file_lines = #file
    map, differs = M.file_to_buffer(file, current)
  end
  local marks = {}
  for line = 1, file_lines do
    local row = map == nil and line or map[line]
    if row and row <= #current then
      marks[line] = vim.api.nvim_buf_set_extmark(buf, M.ns, row - 1, 0, { invalidate = true })
    end
  end
  return { marks = marks, differs = differs }
end

--- The buffer row (0-based) where file line `line` is now, or nil when it was deleted.
function M.row(buf, anchor, line)
  local id = anchor.marks[line]
  if not id then
    return nil
  end
  local mark = vim.api.nvim_buf_get_extmark_by_id(buf, M.ns, id, { details = true })
  if #mark == 0 or mark[3].invalid then
    return nil
  end
  return mark[1]
end

function M.clear(buf)
  vim.api.nvim_buf_clear_namespace(buf, M.ns, 0, -1)
end

return M
