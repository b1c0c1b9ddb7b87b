-- skyline.float: the details window's text.
local eq = require('lua_units').eq
local float = require('skyline.float')

local cases = {}

function cases.wrapped_text_keeps_a_number_with_its_unit()
  local expected = {
    { 'abc 8.8 MiB', 7, '', { 'abc', '8.8 MiB' } }, -- `abc 8.8` fits in 7, but `MiB` stays with its number
    { 'peak (2.0 KiB) here', 9, '', { 'peak', '(2.0 KiB)', 'here' } }, -- inside parentheses too
    { 'took 1,024 ms;', 10, '', { 'took', '1,024 ms;' } },
    { '8.8 apples pie', 10, '', { '8.8 apples', 'pie' } }, -- no unit: the words wrap apart as they come
    { 'a b c', 3, '  ', { 'a b', '  c' } }, -- the indent starts each line after the first
  }
  for _, case in ipairs(expected) do
    eq(case[4], (float.wrap(case[1], case[2], case[3])), ('wrap(%q, %d)'):format(case[1], case[2]))
  end
end

-- In an editor that has profiled nothing: a section reads its context, never the state.
function cases.a_section_draws_from_the_context_it_is_given()
  local sheet = require('skyline.float.layout').new(30)
  local document = { compilation = { graphs = 2, seconds = 1.5 }, attribution = { mode = 'eager_replay' } }
  require('skyline.float.compilation').render(sheet, { document = document, width = 30 })
  local beneath = string.rep(' ', 14) -- the label's width: 16 cells of text a line in 30
  eq({
    'Compiled      torch.compile: 2',
    beneath .. 'graph(s) in',
    beneath .. '1.5 s, not in', -- a number keeps its unit
    beneath .. "the iteration's",
    beneath .. 'time',
    beneath .. 'per-line times',
    beneath .. 'from an eager',
    beneath .. 'run of the',
    beneath .. 'iteration',
  }, sheet.lines, 'the compilation section at 30 columns')
end

-- What was taken from the previous analysis follows the warnings, marked apart from them.
function cases.what_was_reused_follows_the_warnings()
  local sheet = require('skyline.float.layout').new(40)
  local document = {
    warnings = { 'a warning' },
    reused = { memory_batch_sizes = { 8 }, memory_growth_check_skipped = true, reason = 'Taken from before.' },
  }
  require('skyline.float.warnings').render(sheet, { document = document, width = 40 })
  eq({ '', '! a warning', 'i Taken from before.' }, sheet.lines, 'warnings, then what was reused')
  local alone = require('skyline.float.layout').new(40)
  require('skyline.float.warnings').render(alone, { document = { warnings = {} }, width = 40 })
  eq({}, alone.lines, 'nothing to say: no section')
end

-- No section reads the editor's state: each draws from the context it is given.
function cases.no_section_reads_the_state()
  local folder =
    vim.fs.joinpath(vim.fn.fnamemodify(debug.getinfo(1, 'S').source:sub(2), ':p:h'), '..', 'lua', 'skyline', 'float')
  local sections = vim.tbl_filter(function(path)
    return vim.fs.basename(path) ~= 'init.lua'
  end, vim.fn.glob(folder .. '/*.lua', true, true))
  eq(true, #sections > 0, 'the float has sections')
  for _, path in ipairs(sections) do
    local text = table.concat(vim.fn.readfile(path), '\n')
    eq(nil, text:find('skyline.state', 1, true), path)
  end
end

return cases
