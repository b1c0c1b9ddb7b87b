-- Small helpers shared by the modules: messages, trailing-edge debouncing, addresses.
local M = {}

--- A message prefixed with the plugin's name; `level` defaults to INFO. Shown from the main
--- loop: inside an RPC request (the remote plugin delivering an event, any API client) an
--- error message would otherwise become that request's error instead of reaching the user.
function M.notify(message, level)
  vim.schedule(function()
    vim.notify('skyline: ' .. message, level or vim.log.levels.INFO)
  end)
end

function M.error(message)
  M.notify(message, vim.log.levels.ERROR)
end

--- `message` as an error in one line of the message area, cut to fit it: never a hit-enter
--- prompt. For messages whose full text is shown elsewhere (a diagnostic, state().error).
function M.error_line(message)
  vim.schedule(function()
    local lines = vim.split(vim.trim(message), '\n', { plain = true })
    local text = 'skyline: ' .. lines[1]
    local room = math.max(20, vim.v.echospace - 1)
    if vim.fn.strdisplaywidth(text) > room or #lines > 1 then
      text = vim.fn.strcharpart(text, 0, room - 2) .. ' …'
      while vim.fn.strdisplaywidth(text) > room do -- wide characters take two cells
        text = vim.fn.strcharpart(text, 0, vim.fn.strchars(text) - 3) .. ' …'
      end
    end
    vim.notify(text, vim.log.levels.ERROR)
  end)
end

function M.warn(message)
  M.notify(message, vim.log.levels.WARN)
end

--- A function that runs `fn` once calls to it have stopped for `delay_ms` (a `vim.uv` timer),
--- with the arguments of the last call; `cancel()` on the result drops a pending run.
function M.debounce(fn)
  local timer
  local debounced = {}
  function debounced.cancel()
    if timer then
      timer:stop()
      timer:close()
      timer = nil
    end
  end
  function debounced.call(delay_ms, ...)
    debounced.cancel()
    local args = { n = select('#', ...), ... }
    local this = vim.uv.new_timer()
    timer = this
    this:start(delay_ms, 0, function()
      vim.schedule(function()
        if timer ~= this then
          return -- superseded between firing and this scheduled run
        end
        debounced.cancel()
        fn(unpack(args, 1, args.n))
      end)
    end)
  end
  return debounced
end

--- "host:port" or "[v6]:port" → host, port; nil when malformed. For a client: the host is
--- never implied, and the port is 1-65535 (`skyline serve --listen` parses the same forms, see
--- skyline_engine.cli.serve.parse_listen; tests/test_parity.py compares them).
function M.parse_address(text)
  local host, port = text:match('^%[([^%]]+)%]:(%d+)$')
  if not host then
    host, port = text:match('^([^:%[%]]+):(%d+)$')
  end
  port = tonumber(port)
  if not host or not port or port < 1 or port > 65535 then
    return nil
  end
  return host, port
end

local SIZE_PREFIXES = { k = 1, m = 2, g = 3, t = 4 }

--- A size in bytes, as `skyline profile --memory-capacity` reads it (the engine's
--- cli/arguments.parse_size; tests/test_parity.py compares them): a positive integer, or a string
--- such as '1073741824', '24GiB', '8G' (powers of 1024), '80GB' (powers of 1000). nil otherwise.
function M.parse_size(value)
  if type(value) == 'number' then
    return (value >= 1 and value % 1 == 0) and value or nil
  end
  if type(value) ~= 'string' then
    return nil
  end
  local number, unit = vim.trim(value):match('^([%d%.]+)%s*(%a*)$')
  if not number or not (number:match('^%d+$') or number:match('^%d+%.%d+$')) then
    return nil
  end
  unit = unit:lower()
  local power, base = 0, 1024
  if unit ~= '' and unit ~= 'b' then
    power = SIZE_PREFIXES[unit:sub(1, 1)]
    local rest = unit:sub(2)
    if not power or (rest ~= '' and rest ~= 'b' and rest ~= 'ib') then
      return nil
    end
    base = rest == 'b' and 1000 or 1024
  end
  local size = math.floor(tonumber(number) * base ^ power)
  return size >= 1 and size or nil
end

return M
