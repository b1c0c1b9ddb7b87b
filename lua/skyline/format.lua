-- Numbers for people: times, memory, throughput, shares, and text bars.
local M = {}

function M.ms(value)
  return string.format('%.2f ms', value)
end

local UNITS = { 'B', 'KiB', 'MiB', 'GiB', 'TiB' }

--- Binary units, one decimal above bytes: 873811 → "853.3 KiB".
function M.bytes(value)
  local unit = 1
  while math.abs(value) >= 1024 and unit < #UNITS do
    value = value / 1024
    unit = unit + 1
  end
  if unit == 1 then
    return string.format('%d B', value)
  end
  return string.format('%.1f %s', value, UNITS[unit])
end

--- An integer with thousands separators: 1234567 → "1,234,567".
function M.integer(value)
  local text = string.format('%d', math.floor(value + 0.5))
  local sign, digits = text:match('^(%-?)(%d+)$')
  return sign .. digits:reverse():gsub('(%d%d%d)', '%1,'):reverse():gsub('^,', '')
end

function M.throughput(value)
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
