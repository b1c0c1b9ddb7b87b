-- skyline.format: bytes, integers, throughput, times, shares and bars, as the engine writes them.
local units = require('lua_units')
local eq = units.eq
local format = require('skyline.format')

local cases = {}

function cases.bytes_round_like_the_engine()
  local expected = {
    { 0, '0 B' },
    { 1, '1 B' },
    { 512.4, '512 B' },
    { 512.6, '513 B' }, -- rounded like the engine, not truncated
    { 0.75, '1 B' },
    { 2.5, '2 B' }, -- a tie goes to the even neighbour, as in Python
    { 3.5, '4 B' },
    { 1023, '1023 B' },
    { 1024, '1.0 KiB' },
    { 1536, '1.5 KiB' },
    { 1280, '1.2 KiB' }, -- 1.25: a tie
    { 1792, '1.8 KiB' }, -- 1.75: a tie
    { 873811, '853.3 KiB' },
    { 1024 ^ 2 - 1, '1024.0 KiB' },
    { 1024 ^ 2, '1.0 MiB' },
    { 1024 ^ 3, '1.0 GiB' },
    { 1024 ^ 4, '1.0 TiB' },
    { 1024 ^ 5, '1024.0 TiB' }, -- no unit above TiB
    { -1024, '-1.0 KiB' },
  }
  for _, case in ipairs(expected) do
    eq(case[2], (format.bytes(case[1])), ('bytes(%.17g)'):format(case[1]))
  end
  eq('—', (format.bytes(nil)), 'bytes(nil)')
end

function cases.integers_have_thousands_separators()
  local expected = {
    { 0, '0' },
    { 999, '999' },
    { 1000, '1,000' },
    { 1234567.4, '1,234,567' },
    { -1234, '-1,234' },
    { 999.5, '1,000' },
  }
  for _, case in ipairs(expected) do
    eq(case[2], (format.integer(case[1])), ('integer(%.17g)'):format(case[1]))
  end
end

function cases.throughput_time_and_share()
  eq('64,000 samples/s', (format.throughput(64000.2)))
  eq('— samples/s', (format.throughput(nil)))
  eq('2.00 ms', (format.ms(2)))
  eq('12.3%', (format.percent(0.1234)))
end

function cases.bars_fill_their_share_of_the_width()
  eq('██░░', (format.bar(0.5, 4)))
  eq('░░░', (format.bar(-1, 3)))
  eq('███', (format.bar(2, 3)))
  eq('██░░░░░░░░', (format.bar(0.2, 10)))
end

return cases
