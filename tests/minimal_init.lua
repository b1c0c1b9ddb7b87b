-- The test editor's init: this checkout on the runtimepath, the python3 host the tests chose.
-- Loaded with -u (never --clean or -u NONE: those skip the remote-plugin manifest).
local root = vim.fn.fnamemodify(debug.getinfo(1, 'S').source:sub(2), ':p:h:h')
vim.opt.runtimepath:prepend(root)
vim.g.python3_host_prog = assert(os.getenv('SKYLINE_TEST_PYTHON'), 'SKYLINE_TEST_PYTHON is not set')
vim.opt.shortmess:append('I')
vim.o.swapfile = false
