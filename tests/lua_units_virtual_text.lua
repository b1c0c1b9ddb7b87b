-- skyline.virtual_text: the text at the end of a line.
local eq = require('lua_units').eq
local virtual_text = require('skyline.virtual_text')

local cases = {}

local function record(forward, backward, step, memory)
  return { forward_ms = forward, backward_ms = backward, step_ms = step or 0.0, memory_bytes = memory or 0 }
end

function cases.a_line_shows_the_phases_that_did_work()
  local totals = { run_time_ms = 10.0, peak_memory_bytes = 2 ^ 20 }
  local expected = {
    { record(0.4, 0.81, 0.0, 2 ^ 20), 'fwd 0.40 + bwd 0.81 ms · 12.1% · 1.0 MiB' },
    { record(1.31, 0.0), 'fwd 1.31 ms · 13.1%' }, -- an evaluation under no_grad: no backward at all
    { record(0.0, 0.5), 'bwd 0.50 ms · 5.0%' },
    { record(0.0, 0.0, 0.25), 'step 0.25 ms · 2.5%' },
    { record(0.004, 0.0), 'fwd 0.00 ms · 0.0%' }, -- ran, if briefly: shown as it rounds
    { record(0.0, 0.0), nil },
  }
  for i, case in ipairs(expected) do
    eq(case[2], (virtual_text.annotation(case[1], totals, 'self')), ('case %d: %s'):format(i, vim.inspect(case[1])))
  end
end

return cases
