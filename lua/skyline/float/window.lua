-- The float's window: a scratch buffer filled from a Sheet, laid out for the editor's size (again
-- on VimResized), closed by q, <Esc> or leaving it; <CR> on a row that names a line jumps there.
local config = require('skyline.config')
local project = require('skyline.project')

local M = {}

local ns = vim.api.nvim_create_namespace('skyline.float')
M.MIN_WIDTH = 60

-- The open float: {win, buf, origin (the window to jump in), targets = {[row] = {path, line}}}.
local open_float = nil

--- The widest the float can be in this editor: its columns less the border and a margin.
function M.available_width()
  return math.max(M.MIN_WIDTH, vim.o.columns - 4)
end

---@param sheet skyline.float.Sheet
local function fill(buf, sheet)
  vim.bo[buf].modifiable = true
  vim.api.nvim_buf_set_lines(buf, 0, -1, false, sheet.lines)
  vim.bo[buf].modifiable = false
  vim.api.nvim_buf_clear_namespace(buf, ns, 0, -1)
  for _, span in ipairs(sheet.spans) do
    vim.api.nvim_buf_set_extmark(buf, ns, span[1], span[2], { end_col = span[3], hl_group = span[4] })
  end
end

---@param sheet skyline.float.Sheet
local function layout(sheet)
  local width = M.MIN_WIDTH
  for _, line in ipairs(sheet.lines) do
    width = math.max(width, vim.fn.strdisplaywidth(line))
  end
  width = math.max(1, math.min(width + 1, vim.o.columns - 4))
  local height = math.max(1, math.min(#sheet.lines, vim.o.lines - 6))
  return {
    relative = 'editor',
    width = width,
    height = height,
    row = math.max(0, math.floor((vim.o.lines - height) / 2) - 1),
    col = math.max(0, math.floor((vim.o.columns - width) / 2)),
  }
end

local function border()
  local configured = config.get().float_border
  if configured then
    return configured
  end
  return vim.o.winborder == '' and 'rounded' or nil -- nil: 'winborder' applies
end

function M.is_open()
  return open_float ~= nil and vim.api.nvim_win_is_valid(open_float.win)
end

function M.close()
  local closing = open_float
  open_float = nil -- first: closing fires WinLeave, which calls close() again
  if closing and vim.api.nvim_win_is_valid(closing.win) then
    vim.api.nvim_win_close(closing.win, true)
  end
end

-- <CR>: go to the line the row names, in the window the float was opened from.
local function jump()
  local target = open_float.targets[vim.api.nvim_win_get_cursor(0)[1]]
  if not target then
    return
  end
  local origin = open_float.origin
  M.close()
  if vim.api.nvim_win_is_valid(origin) then
    vim.api.nvim_set_current_win(origin)
  end
  if project.buffer_path(vim.api.nvim_get_current_buf()) ~= target.path then
    vim.cmd.edit(vim.fn.fnameescape(target.path))
  end
  local last = vim.api.nvim_buf_line_count(0)
  vim.api.nvim_win_set_cursor(0, { math.min(target.line, last), 0 })
end

-- q and <Esc> close the float, <CR> jumps to the row's line.
local function map_keys(buf)
  for _, lhs in ipairs({ 'q', '<Esc>' }) do
    vim.keymap.set('n', lhs, M.close, { buffer = buf, nowait = true, desc = 'skyline: close the breakdown' })
  end
  vim.keymap.set('n', '<CR>', jump, { buffer = buf, nowait = true, desc = 'skyline: go to this line' })
end

-- The float follows the editor's size (`on_resize`), and closes when the cursor leaves it.
local function watch(buf, win, on_resize)
  vim.api.nvim_create_autocmd('VimResized', {
    group = vim.api.nvim_create_augroup('skyline.float', { clear = true }),
    desc = 'skyline: lay the breakdown out again for the new size',
    callback = function()
      if not M.is_open() then
        return true -- closed: the autocommand goes too
      end
      on_resize()
    end,
  })
  vim.api.nvim_create_autocmd('WinLeave', {
    buffer = buf,
    once = true,
    callback = function()
      vim.schedule(function() -- a window cannot be closed while it is being left
        if open_float and open_float.win == win then
          M.close()
        end
      end)
    end,
  })
end

--- Opens the float on `sheet` with `title`; `on_resize` lays it out again when the editor's size
--- changes.
---@param sheet skyline.float.Sheet
---@param title string
---@param on_resize fun()
function M.open(sheet, title, on_resize)
  local buf = vim.api.nvim_create_buf(false, true)
  vim.bo[buf].bufhidden = 'wipe'
  fill(buf, sheet)
  vim.bo[buf].filetype = 'skyline-breakdown'
  local win_config = layout(sheet)
  win_config.style = 'minimal'
  win_config.border = border()
  win_config.title = { { title, 'SkylineFloatTitle' } }
  win_config.title_pos = 'center'
  local origin = vim.api.nvim_get_current_win()
  local win = vim.api.nvim_open_win(buf, true, win_config)
  vim.wo[win].cursorline = true
  vim.wo[win].winhighlight = 'FloatBorder:SkylineFloatBorder'
  open_float = { win = win, buf = buf, origin = origin, targets = sheet.targets }
  map_keys(buf)
  watch(buf, win, on_resize)
end

--- Shows `sheet` in the open float, laid out again for it.
---@param sheet skyline.float.Sheet
function M.redraw(sheet)
  fill(open_float.buf, sheet)
  open_float.targets = sheet.targets
  vim.api.nvim_win_set_config(open_float.win, layout(sheet))
end

return M
