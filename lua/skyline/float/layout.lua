-- The breakdown float's layout: the Sheet its sections write to, and what they share. A section
-- adds lines to a Sheet, each made of pieces `{text, highlight group or nil}`, and a line may name
-- the source line <CR> jumps to. A section's label takes the first LABEL cells of its first line;
-- its text goes beside the label, its further lines beneath, indented as far (`Sheet:add_text`).
local format = require('skyline.format')

local M = {}

M.LABEL = 14 -- width of the section labels
M.BAR = 12 -- cells of a bar (a memory bar against the capacity takes twice as many)

---@alias skyline.float.Piece {[1]: string, [2]: string?} text, and its highlight group

---@class skyline.float.Target
---@field path string absolute
---@field line integer 1-based

---@class skyline.float.Sheet
---@field width integer the most cells a line may take
---@field lines string[]
---@field spans {[1]: integer, [2]: integer, [3]: integer, [4]: string}[] row (0-based), start and end byte, group
---@field targets table<integer, skyline.float.Target> the source line each row (1-based) jumps to
local Sheet = {}
Sheet.__index = Sheet

--- An empty sheet for a float at most `width` cells wide.
---@param width integer
---@return skyline.float.Sheet
function M.new(width)
  return setmetatable({ width = width, lines = {}, spans = {}, targets = {} }, Sheet)
end

--- Adds a line made of `pieces`; `target`: where <CR> on it jumps.
---@param pieces skyline.float.Piece[]
---@param target skyline.float.Target?
function Sheet:add(pieces, target)
  local text = ''
  for _, piece in ipairs(pieces) do
    if piece[2] then
      table.insert(self.spans, { #self.lines, #text, #text + #piece[1], piece[2] })
    end
    text = text .. piece[1]
  end
  table.insert(self.lines, text)
  self.targets[#self.lines] = target
end

--- `text` padded with spaces to `width` cells.
function M.pad(text, width)
  local missing = width - vim.fn.strdisplaywidth(text)
  return missing > 0 and text .. string.rep(' ', missing) or text
end

--- `text` in a column of `width` cells: cut to leave at least one space before the next column.
function M.cell(text, width)
  if vim.fn.strdisplaywidth(text) >= width then
    text = vim.fn.strcharpart(text, 0, width - 2) .. '…'
  end
  return M.pad(text, width)
end

--- `text` right-aligned in `width` cells.
function M.lpad(text, width)
  local missing = width - vim.fn.strdisplaywidth(text)
  return missing > 0 and string.rep(' ', missing) .. text or text
end

--- A section's label: the piece that fills the label column.
---@param text string '' for none: the text beside it lines up beneath the label above
---@param hl string?
---@return skyline.float.Piece
function M.label(text, hl)
  return { M.pad(text, M.LABEL), hl }
end

--- The first two pieces of a table's row (14 cells, as wide as a label): `▸ ` where it is the
--- current one, and `value` right-aligned.
---@return skyline.float.Piece, skyline.float.Piece
function M.row_head(value, is_current)
  local hl = is_current and 'SkylineFloatCurrent' or nil
  return { is_current and '▸ ' or '  ', hl }, { M.lpad(format.integer(value), 10) .. '  ', hl }
end

--- `path:line` in at most `width` cells: the middle of the path gives way first, so that the
--- file name and the line number always show ("examples/c…/model.py:19").
function M.shorten_place(path, line, width)
  local suffix = ':' .. line
  local text = path .. suffix
  if vim.fn.strdisplaywidth(text) <= width then
    return text
  end
  local name = vim.fs.basename(path)
  local head = path:sub(1, #path - #name)
  local room = width - vim.fn.strdisplaywidth(name .. suffix) - 2 -- 2: '…/'
  if room >= 1 and head ~= '' then
    return vim.fn.strcharpart(head, 0, room) .. '…/' .. name .. suffix
  end
  return '…' .. vim.fn.strcharpart(name .. suffix, vim.fn.strchars(name .. suffix) - width + 1)
end

-- Units that stay on their number's line when text wraps: `8.8 MiB`, never `8.8` / `MiB`.
local UNITS = { B = true, KiB = true, MiB = true, GiB = true, TiB = true, ms = true, s = true }

--- The words of `text`, a number and its unit as one.
local function words(text)
  local out = {}
  for word in text:gmatch('%S+') do
    local previous = out[#out]
    if previous and UNITS[word:gsub('[,.;:)]+$', '')] and previous:match('^%(?[%d.,]+$') then
      out[#out] = previous .. ' ' .. word
    else
      table.insert(out, word)
    end
  end
  return out
end

--- `text` wrapped at word boundaries into lines of at most `width` cells (a word longer than a
--- line is cut), the lines after the first starting with `indent`.
---@return string[]
function M.wrap(text, width, indent)
  local lines, current = {}, ''
  for _, word in ipairs(words(text)) do
    local candidate = current == '' and word or (current .. ' ' .. word)
    if current ~= '' and vim.fn.strdisplaywidth(candidate) > width then
      table.insert(lines, current)
      candidate = indent .. word
    end
    while vim.fn.strdisplaywidth(candidate) > width do
      table.insert(lines, vim.fn.strcharpart(candidate, 0, width))
      candidate = indent .. vim.fn.strcharpart(candidate, width)
    end
    current = candidate
  end
  if current ~= '' then
    table.insert(lines, current)
  end
  return lines
end

--- Text beside a section's label (or beneath it, `label` nil), wrapped at word boundaries to the
--- sheet's width, its further lines beneath. The label is a header unless `label_hl` says otherwise.
---@param label string?
---@param text string
---@param hl string? the text's highlight group
---@param label_hl string? the label's (default SkylineFloatHeader)
function Sheet:add_text(label, text, hl, label_hl)
  for i, line in ipairs(M.wrap(text, self.width - M.LABEL, '')) do
    local first = i == 1 and label
    self:add({ M.label(first or '', first and (label_hl or 'SkylineFloatHeader') or nil), { line, hl } })
  end
end

--- Text beneath the label above, wrapped as `add_text` wraps it.
function Sheet:add_beneath(text, hl)
  self:add_text(nil, text, hl)
end

--- A throughput that can be shown: positive and finite, else nil (shown as —).
---@param samples_per_second number?
---@return number?
function M.sane(samples_per_second)
  if samples_per_second and samples_per_second > 0 and samples_per_second < math.huge then
    return samples_per_second
  end
  return nil
end

return M
