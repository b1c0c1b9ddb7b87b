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

return cases
