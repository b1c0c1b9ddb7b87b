from skyline_engine.cli import run

run()
