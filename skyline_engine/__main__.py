from skyline_engine.cli import main

raise SystemExit(main())
