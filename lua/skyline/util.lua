-- Small helpers shared by the modules: messages, trailing-edge debouncing, addresses.
local M = {}

-- Messages asked for in one tick of the main loop, shown together once it ends.
local pending = {}

-- `text` cut to `room` screen cells, ending in ` …` where it was cut (wide characters take two).
local function cut(text, room)
  if vim.fn.strdisplaywidth(text) <= room then
    return text, false
  end
  local shown = vim.fn.strcharpart(text, 0, room - 2) .. ' …'
  while vim.fn.strdisplaywidth(shown) > room do
    shown = vim.fn.strcharpart(shown, 0, vim.fn.strchars(shown) - 3) .. ' …'
  end
  return shown, true
end

--- Where the plugin and the engine write their logs (`:checkhealth skyline` names it).
function M.log_dir()
  return vim.fs.joinpath(vim.fn.stdpath('state'), 'skyline')
end

-- Appends `text` to the plugin's log.
local function log(text)
  local dir = M.log_dir()
  pcall(function()
    vim.fn.mkdir(dir, 'p')
    local lines = vim.split(text, '\n', { plain = true })
    lines[1] = os.date('%Y-%m-%d %H:%M:%S ') .. lines[1]
    vim.fn.writefile(lines, vim.fs.joinpath(dir, 'plugin.log'), 'a')
  end)
end

-- Shows the pending messages as one line of the message area, at the highest level among them:
-- several lines, or one wider than the space left beside 'showcmd' and 'ruler' (v:echospace),
-- raise the hit-enter prompt (at 80 columns, 68 cells). A message cut short is written whole to
-- the plugin's log.
local function flush()
  local messages = pending
  pending = {}
  local level = vim.log.levels.DEBUG
  local texts = {}
  for _, message in ipairs(messages) do
    level = math.max(level, message.level)
    texts[#texts + 1] = vim.trim(message.text):gsub('%s*\n%s*', ' ')
  end
  local text, was_cut = cut('skyline: ' .. table.concat(texts, ' · '), math.max(20, vim.v.echospace - 1))
  if was_cut then
    for _, message in ipairs(messages) do
      log(message.text)
    end
  end
  vim.notify(text, level)
end

--- A message prefixed with the plugin's name; `level` defaults to INFO. Shown from the main
--- loop (inside an RPC request, an error message would otherwise become that request's error
--- instead of reaching the user), in one line with the others of the same tick (`flush`).
function M.notify(message, level)
  pending[#pending + 1] = { text = message, level = level or vim.log.levels.INFO }
  if #pending == 1 then
    vim.schedule(flush)
  end
end

function M.error(message)
  M.notify(message, vim.log.levels.ERROR)
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
