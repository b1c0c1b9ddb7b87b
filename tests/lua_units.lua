-- The checks that the Lua unit cases (tests/lua_units_*.lua) make, and the runner that
-- tests/test_lua_units.py calls in a headless Neovim. Each case file returns a table of cases,
-- each defined as `function cases.name()`, that raise on a failed check.
local M = {}

local here = vim.fn.fnamemodify(debug.getinfo(1, 'S').source:sub(2), ':p:h')
-- The case files require this module as `lua_units`.
package.path = here .. '/?.lua;' .. package.path

--- Fails unless `actual` is `expected`: tables by their contents (vim.deep_equal), nil only as
--- nil (not false). `what` names the case in the message.
function M.eq(expected, actual, what)
  if not vim.deep_equal(expected, actual) then
    local message = ('%s\nexpected: %s\n     got: %s'):format(
      what or 'not equal',
      vim.inspect(expected),
      vim.inspect(actual)
    )
    error(message, 2)
  end
end

--- Fails unless `text` is a string that holds `part` (plainly, no pattern) and one line only.
function M.holds(text, part, what)
  if type(text) ~= 'string' or not text:find(part, 1, true) or text:find('\n') then
    error(('%s\n%s\nis not one line holding\n%s'):format(what or '', vim.inspect(text), vim.inspect(part)), 2)
  end
end

--- Fails unless `text` is a string that starts with `start`.
function M.starts(text, start, what)
  if type(text) ~= 'string' or not vim.startswith(text, start) then
    error(('%s\n%s\ndoes not start with\n%s'):format(what or '', vim.inspect(text), vim.inspect(start)), 2)
  end
end

--- The names of the cases of the file `path`, sorted.
function M.names(path)
  local names = vim.tbl_keys(dofile(path))
  table.sort(names)
  return names
end

--- Runs the case `name` of the file `path`: nil when it passes, else its error and traceback.
function M.run(path, name)
  local case = dofile(path)[name]
  if type(case) ~= 'function' then
    return ('%s defines no case %s'):format(path, name)
  end
  local ok, failure = xpcall(case, debug.traceback)
  if not ok then
    return tostring(failure)
  end
end

return M
