-- luacheck's configuration: `bash scripts/dev.sh lint` runs `luacheck .` from the repository's root
-- (luacheck 1.1.0, Debian's lua-check; CONTRIBUTING.md).
std = 'luajit' -- Neovim's Lua
globals = { 'vim' } -- Neovim's API; the plugin sets fields of it too (vim.g, vim.bo, vim.wo)
include_files = { 'lua/**/*.lua', 'plugin/**/*.lua', 'tests/**/*.lua' }
codes = true -- each warning with its code, for a `-- luacheck: ignore CODE` where one is right
-- StyLua lays the code out in 120 columns (stylua.toml); what it leaves longer is text it cannot
-- break, a message kept whole so that it can be searched for.
max_line_length = false
