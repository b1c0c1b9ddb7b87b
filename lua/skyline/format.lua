-- Numbers for people: times, memory, throughput, shares, and text bars. A value that is not known
-- (nil) shows as `—`, as in the engine's reports (skyline_engine/render/units.py).
local M = {}

M.UNKNOWN = '—'

function M.ms(value)
  return string.format('%.2f ms', value)
end

local UNITS = { 'B', 'KiB', 'MiB', 'GiB', 'TiB' }

-- `value` with `decimals` (0 or 1) decimals, a tie rounded to even as Python's format does:
-- LuaJIT's string.format rounds it away from zero (1.25 → "1.3" where Python says "1.2"). A tie
-- is an exact binary value: x.5 for no decimals, x.25 or x.75 for one (4·value is then odd).
local function fixed(value, decimals)
  local format = '%.' .. decimals .. 'f'
  local scale = decimals == 0 and 1 or 10
  local tie
  if decimals == 0 then
    tie = math.abs(value) % 1 == 0.5
  else
    tie = math.abs(value * 4) % 2 == 1
  end
  if not tie then
    return string.format(format, value)
  end
  local lower = math.floor(value * scale) -- exact: value·scale is k + 0.5 here
  local even = lower % 2 == 0 and lower or lower + 1
  local rounded = even / scale
  if rounded == 0 and value < 0 then
    rounded = -0.0 -- Python keeps the sign: -0.5 → "-0"
  end
  return string.format(format, rounded)
end

--- Binary units, one decimal above bytes: 873811 → "853.3 KiB"; the same text as the engine's
--- format_bytes (tests/test_parity.py).
function M.bytes(value)
  if value == nil then
    return M.UNKNOWN
  end
  local unit = 1
  while math.abs(value) >= 1024 and unit < #UNITS do
    value = value / 1024
    unit = unit + 1
  end
  if unit == 1 then
    return fixed(value, 0) .. ' B' -- rounded, not truncated: predictions are fractional
  end
  return fixed(value, 1) .. ' ' .. UNITS[unit]
end

--- An integer with thousands separators: 1234567 → "1,234,567".
function M.integer(value)
  if value == nil then
    return M.UNKNOWN
  end
  local text = string.format('%d', math.floor(value + 0.5))
  local sign, digits = text:match('^(%-?)(%d+)$')
  return sign .. digits:reverse():gsub('(%d%d%d)', '%1,'):reverse():gsub('^,', '')
end

function M.throughput(value)
  if value == nil then
    return M.UNKNOWN .. ' samples/s'
  end
  return M.integer(value) .. ' samples/s'
end

function M.percent(fraction)
  return string.format('%.1f%%', fraction * 100)
end

--- A bar of `width` cells, `fraction` of them full (clamped to 0..1).
function M.bar(fraction, width)
  local full = math.floor(math.max(0, math.min(1, fraction)) * width + 0.5)
  return string.rep('█', full) .. string.rep('░', width - full)
end

return M
